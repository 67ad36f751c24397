# The one place where third-party dependencies and their minimum versions are pinned.
# All come from Debian bookworm packages (installed by .ci/run / scripts/setup-deps).
#   nlohmann-json3-dev 3.11   JSON (config.json, safetensors headers, tokenizer_config.json)
#   libcli11-dev       2.1    command line of the `k3` binary
#   libpcre2-dev       10.42  Unicode regex for the tokenizer's pre-tokeniser (JIT)
#   libgtest-dev       1.12   unit tests
#   libboost1.81-dev   1.81   Boost.Beast + Boost.Asio (header-only) for the HTTP server of `k3 serve`
#   libopenmpi-dev     4.1    (optional, K3_MPI) tensor / expert parallel over processes; openmpi-bin: mpirun
#   NCCL               (with K3_CUDA) the communicator of GPU ranks, from the CUDA image (nccl.h, libnccl)
#   (threads: the project's own pool, src/k3/core/thread_pool.h; `#pragma omp simd` needs only -fopenmp-simd)
#   xgrammar           0.2.9  (K3_GRAMMAR, default ON) grammar engine of structured outputs: its C++ core only,
#                             built from the PyPI source distribution below (scripts/setup-deps fetches it into
#                             K3_DEPS_DIR; cmake/xgrammar.cmake builds it; docs/serving.md "Structured outputs")
#   CUTLASS / CuTe     4.2.0  (K3_CUDA only) headers of NVIDIA's CUDA templates: the grouped bf16 GEMM of the MoE
#                             experts at prefill sizes (src/k3/backend/cuda/cutlass/). Taken from PyPI's
#                             `nvidia-cutlass` wheel (it ships the C++ headers), pinned below; `scripts/setup-deps cuda`
#                             unpacks its include/ into K3_DEPS_DIR/cutlass-<version>.
# Python test packages: python/requirements-test.txt (openai, for tests/e2e); python3-jsonschema (Debian).
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 2.1 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8>=10.40)
find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED CONFIG)  # headers only: Beast, Asio (Boost.System is header-only since 1.69)
if(K3_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)  # MPI's C API from C++ (the C++ bindings are deprecated)
  find_package(MPI 3.1 COMPONENTS CXX)  # optional: without it the build has no multi-process tensor parallel
  if(NOT MPI_CXX_FOUND)
    message(STATUS "K3_MPI: no MPI found (install libopenmpi-dev): tensor parallel over processes is off")
  endif()
endif()
if(K3_BUILD_TESTS)
  find_package(GTest 1.11 REQUIRED)
endif()

# Where scripts/setup-deps puts what it downloads (xgrammar's source, CUTLASS's headers); the build never downloads.
set(K3_DEPS_DIR "$ENV{K3_DEPS_DIR}" CACHE PATH "where scripts/setup-deps puts downloaded sources")
if(NOT K3_DEPS_DIR)
  set(K3_DEPS_DIR "${CMAKE_SOURCE_DIR}/.deps")
endif()

# xgrammar: the pinned source distribution (scripts/setup-deps reads these three lines).
set(K3_XGRAMMAR_VERSION 0.2.9)
set(K3_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(K3_XGRAMMAR_URL https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-0.2.9.tar.gz)
if(K3_GRAMMAR)
  include(${CMAKE_CURRENT_LIST_DIR}/xgrammar.cmake)
endif()

# CUTLASS: the pinned wheel (scripts/setup-deps cuda reads these three lines); the CUDA block of CMakeLists.txt
# looks for its headers under K3_DEPS_DIR/cutlass-${K3_CUTLASS_VERSION}/include.
set(K3_CUTLASS_VERSION 4.2.0.0)
set(K3_CUTLASS_SHA256 f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6)
set(K3_CUTLASS_URL https://files.pythonhosted.org/packages/21/6b/e86fc2fd536dd4b8bd2209aa31d7002610c501b0802337787eac9c9b328c/nvidia_cutlass-4.2.0.0-py3-none-any.whl)
