#include "k3/core/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define K3_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define K3_SANITIZED 1
#endif

namespace k3 {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};

// Only async-signal-safe calls below (write, backtrace_symbols_fd; backtrace itself is preloaded at install,
// since its first call may allocate while libgcc is loaded).
void put(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void put_hex(uintptr_t v) {
  char buf[2 + 16 + 1];
  char* p = buf + sizeof buf - 1;
  *p = '\0';
  do {
    *--p = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v != 0);
  *--p = 'x';
  *--p = '0';
  put(p);
}

void on_fatal(int sig, siginfo_t* info, void*) {
  static std::atomic<bool> once{false};
  if (!once.exchange(true)) {  // a second thread faulting meanwhile only re-raises
    put("\nk3: fatal signal ");
    put(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : "SIGILL");
    put(" at address ");
    put_hex(reinterpret_cast<uintptr_t>(info != nullptr ? info->si_addr : nullptr));
    put("; native stack of the faulting thread (addr2line -f -C -e <binary> <+offset>):\n");
    void* frames[64];
    const int n = ::backtrace(frames, 64);
    ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
    put("k3: this is a bug in k3.cpp: please report it with the command line and the lines above\n");
  }
  ::signal(sig, SIG_DFL);  // die of the same signal (exit status 128 + sig, a core dump where enabled)
  ::raise(sig);
}

}  // namespace

bool install_crash_report() {
#ifdef K3_SANITIZED
  return false;
#else
  static const bool installed = [] {
    void* warm[1];
    ::backtrace(warm, 1);
    // Its own stack, so that a stack overflow of the main thread can still be reported (sigaltstack is per thread:
    // a worker's overflow dies without the report).
    static char alt[64 * 1024];
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    ::sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) ::sigaction(s, &sa, nullptr);
    return true;
  }();
  return installed;
#endif
}

}  // namespace k3
