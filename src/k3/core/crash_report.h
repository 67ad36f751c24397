// A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL) prints what it was, the faulting address and the native
// stack of the faulting thread to stderr before the process dies as it would have (like ggml's
// ggml_print_backtrace): the device images have no debugger, and a bare "exit 139" says nothing.
// Frames print as `binary(+offset)`: `addr2line -f -C -e <binary> <offset>` on the same build names them.
#pragma once

namespace k3 {

// Installs the handler once (later calls do nothing). Returns false, installing nothing, in a sanitizer build:
// ASan / TSan / UBSan report these signals better themselves.
bool install_crash_report();

}  // namespace k3
