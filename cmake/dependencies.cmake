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
# Python test packages: python/requirements-test.txt (openai, for tests/e2e).
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
