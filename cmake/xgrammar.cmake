# xgrammar's C++ core (the grammar engine of structured outputs), built from its pinned PyPI source
# distribution: no Python, no nanobind/TVM-FFI part, our own target over its cpp/*.cc (its CMakeLists adds
# -Werror and -flto=auto to the global flags, which a newer compiler or our non-LTO link would trip over).
# The tarball is fetched by scripts/setup-deps into K3_DEPS_DIR (default: <source>/.deps, git-ignored);
# the build itself never touches the network.
set(_xg_tar "${K3_DEPS_DIR}/xgrammar-${K3_XGRAMMAR_VERSION}.tar.gz")
if(NOT EXISTS "${_xg_tar}")
  message(FATAL_ERROR "K3_GRAMMAR: ${_xg_tar} is missing. Run scripts/setup-deps (it downloads xgrammar "
                      "${K3_XGRAMMAR_VERSION}'s source distribution), or configure with -DK3_GRAMMAR=OFF "
                      "(no structured outputs: response_format / strict tools / grammars are then answered 400).")
endif()
file(SHA256 "${_xg_tar}" _xg_sha)
if(NOT _xg_sha STREQUAL K3_XGRAMMAR_SHA256)
  message(FATAL_ERROR "K3_GRAMMAR: ${_xg_tar} has sha256 ${_xg_sha}, expected ${K3_XGRAMMAR_SHA256} "
                      "(delete it and run scripts/setup-deps again)")
endif()
set(_xg_root "${CMAKE_BINARY_DIR}/_deps/xgrammar-${K3_XGRAMMAR_VERSION}")
if(NOT EXISTS "${_xg_root}/.k3-extracted-${K3_XGRAMMAR_SHA256}")
  file(REMOVE_RECURSE "${_xg_root}")
  file(ARCHIVE_EXTRACT INPUT "${_xg_tar}" DESTINATION "${CMAKE_BINARY_DIR}/_deps")
  file(TOUCH "${_xg_root}/.k3-extracted-${K3_XGRAMMAR_SHA256}")
endif()
file(GLOB _xg_sources "${_xg_root}/cpp/*.cc" "${_xg_root}/cpp/support/*.cc" "${_xg_root}/cpp/converter_ext/*.cc")
add_library(k3_xgrammar STATIC ${_xg_sources})
set_target_properties(k3_xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
target_include_directories(k3_xgrammar PUBLIC "${_xg_root}/include")
target_include_directories(k3_xgrammar SYSTEM PUBLIC "${_xg_root}/3rdparty/picojson" "${_xg_root}/3rdparty/dlpack/include")
target_compile_definitions(k3_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
target_compile_options(k3_xgrammar PRIVATE -w)  # third-party code: its warnings are not ours to fix
target_link_libraries(k3_xgrammar PUBLIC Threads::Threads)
