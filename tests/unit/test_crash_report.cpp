// The fatal-signal report (core/crash_report.h): a child that faults prints the signal, the address and a
// stack naming its frames, then still dies of that signal (the parent sees the same status as without it).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "k3/core/crash_report.h"

namespace {

// Runs `body` in a forked child with stderr piped back; returns the child's stderr and wait status.
template <typename F>
std::string run_child(F body, int& status) {
  int fd[2];
  if (::pipe(fd) != 0) return "";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fd[1], STDERR_FILENO);
    ::close(fd[0]);
    body();
    ::_exit(0);
  }
  ::close(fd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd[0]);
  ::waitpid(pid, &status, 0);
  return out;
}

volatile uintptr_t g_bad_address = 0x10;  // volatile: the compiler cannot see the fault coming

__attribute__((noinline)) void write_through(volatile int* p) { *p = 42; }

TEST(CrashReport, SegfaultPrintsSignalAddressAndStackThenDiesOfIt) {
  int status = 0;
  const std::string err = run_child(
      [] {
        if (!k3::install_crash_report()) ::_exit(77);
        write_through(reinterpret_cast<volatile int*>(g_bad_address));
      },
      status);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "sanitizer build: the sanitizer reports faults";
  ASSERT_TRUE(WIFSIGNALED(status)) << err;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  EXPECT_NE(err.find("fatal signal SIGSEGV at address 0x10;"), std::string::npos) << err;
  EXPECT_NE(err.find("k3_tests"), std::string::npos) << "no frame of the test binary in:\n" << err;
}

TEST(CrashReport, WithoutAFaultNothingIsPrinted) {
  int status = 0;
  const std::string err = run_child([] { k3::install_crash_report(); }, status);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(err, "");
}

}  // namespace
