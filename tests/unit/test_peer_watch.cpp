// PeerWatch (dist/peer_watch.h): a rank waiting in a collective notices that another rank of its host is
// gone -- exited and reaped, or exited and not yet reaped (a zombie) -- and a reused pid is not taken
// for the process that had it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k3/dist/peer_watch.h"

namespace {

using k3::dist::PeerLost;
using k3::dist::PeerWatch;
using k3::dist::ProcessId;

// A child that sleeps until killed, and its id.
ProcessId start_sleeper(pid_t& pid) {
  pid = ::fork();
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  ProcessId id = k3::dist::this_process();  // same host
  id.pid = pid;
  id.start_ticks = 0;  // any process with this pid
  return id;
}

TEST(PeerWatch, ThisProcessIsAlive) {
  const ProcessId me = k3::dist::this_process();
  EXPECT_GT(me.start_ticks, 0u);
  EXPECT_TRUE(k3::dist::process_alive(me));
}

TEST(PeerWatch, NoticesAPeerThatExited) {
  pid_t pid = 0;
  const ProcessId child = start_sleeper(pid);
  ASSERT_GT(pid, 0);
  const PeerWatch watch({k3::dist::this_process(), child}, 0);
  EXPECT_EQ(watch.watched(), 1u);
  EXPECT_NO_THROW(watch.check("a test"));
  ::kill(pid, SIGKILL);
  // Not yet reaped: a zombie is gone too.
  for (int i = 0; i < 200 && k3::dist::process_alive(child); ++i) ::usleep(1000);
  try {
    watch.check("a test");
    ADD_FAILURE() << "a killed peer went unnoticed";
  } catch (const PeerLost& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 (pid " + std::to_string(pid) + ") exited during a test"),
              std::string::npos)
        << e.what();
  }
  ::waitpid(pid, nullptr, 0);
  EXPECT_THROW(watch.check("a test"), PeerLost);  // reaped
}

TEST(PeerWatch, AnotherProcessWithTheSamePidIsNotThePeer) {
  ProcessId me = k3::dist::this_process();
  me.start_ticks += 1;  // "this pid, started at another time": a pid that was reused
  EXPECT_FALSE(k3::dist::process_alive(me));
}

TEST(PeerWatch, RanksOnOtherHostsAreNotWatched) {
  ProcessId elsewhere = k3::dist::this_process();
  elsewhere.host_hash ^= 1;
  elsewhere.pid = 1 << 30;  // no such pid here
  const PeerWatch watch({k3::dist::this_process(), elsewhere}, 0);
  EXPECT_EQ(watch.watched(), 0u);
  EXPECT_NO_THROW(watch.check("a test"));
}

}  // namespace
