// NUMA placement: cpulist parsing, the sysfs topology reader (on a synthetic 2-node tree and on this
// machine), the placement plan of each --numa mode, and the pool binding its workers to the planned CPUs.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "k3/core/error.h"
#include "k3/core/numa.h"
#include "k3/core/thread_pool.h"
#include "test_util.h"

using k3::NumaMode;
using k3::NumaNode;

namespace {
std::vector<int> range(int lo, int hi) {
  std::vector<int> v;
  for (int c = lo; c <= hi; ++c) v.push_back(c);
  return v;
}
const std::vector<NumaNode> kTwoSockets = {{0, range(0, 3)}, {1, range(4, 7)}};
}  // namespace

TEST(Numa, ParsesCpuLists) {
  EXPECT_EQ(k3::parse_cpulist("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(k3::parse_cpulist("5"), std::vector<int>{5});
  EXPECT_EQ(k3::parse_cpulist(""), std::vector<int>{});
  EXPECT_EQ(k3::parse_cpulist("3,1-2,2"), (std::vector<int>{1, 2, 3}));
  for (const char* bad : {"3-1", "a", "1,", "-1", "1-", "1--2", "0-99999999999", ",1"})
    EXPECT_THROW(k3::parse_cpulist(bad), k3::Error) << bad;
}

TEST(Numa, ReadsNodesRestrictedToAllowedCpus) {
  k3test::TempDir d;
  for (auto [node, list] : {std::pair{"node0", "0-3"}, std::pair{"node1", "4-7"}}) {
    k3test::fs::create_directories(d.path / node);
    std::ofstream(d.path / node / "cpulist") << list << "\n";
  }
  k3test::fs::create_directories(d.path / "nodeX");  // not a node
  std::ofstream(d.path / "possible") << "0-1\n";
  auto nodes = k3::read_numa_nodes(range(0, 7), d.str());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[1].id, 1);
  EXPECT_EQ(nodes[1].cpus, range(4, 7));
  nodes = k3::read_numa_nodes({1, 2, 5}, d.str());  // taskset / cgroup: only these
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].cpus, (std::vector<int>{1, 2}));
  EXPECT_EQ(k3::read_numa_nodes({0, 1}, d.str()).size(), 1u);  // node 1 has none of ours: dropped
  nodes = k3::read_numa_nodes({0, 1}, d.str() + "/missing");    // no NUMA in the kernel: one node
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].cpus, (std::vector<int>{0, 1}));
}

TEST(Numa, ThisMachinesNodesCoverTheAllowedCpus) {
  const auto allowed = k3::allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  std::vector<int> all;
  for (const auto& n : k3::read_numa_nodes(allowed)) all.insert(all.end(), n.cpus.begin(), n.cpus.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, allowed);
}

TEST(Numa, DistributeSpreadsThreadsRoundRobin) {
  auto p = k3::plan_placement(NumaMode::Distribute, kTwoSockets, 5, 0);
  ASSERT_EQ(p.cpus.size(), 5u);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(p.cpus[t], kTwoSockets[t % 2].cpus) << t;
  EXPECT_NE(p.summary.find("5 threads over 2 nodes (node 0: 3, node 1: 2)"), std::string::npos) << p.summary;
}

TEST(Numa, IsolateKeepsThreadsOnTheStartingNode) {
  auto p = k3::plan_placement(NumaMode::Isolate, kTwoSockets, 6, 5);
  ASSERT_EQ(p.cpus.size(), 6u);
  for (const auto& c : p.cpus) EXPECT_EQ(c, range(4, 7));
  EXPECT_NE(p.summary.find("on node 1 (CPUs 4-7); more threads than the node's 4 CPUs"), std::string::npos) << p.summary;
  EXPECT_EQ(k3::plan_placement(NumaMode::Isolate, kTwoSockets, 2, 1).cpus[0], range(0, 3));
}

TEST(Numa, OneNodeOrNoModeIsANoOpThatSaysSo) {
  const std::vector<NumaNode> one = {{0, range(0, 1)}};
  for (NumaMode m : {NumaMode::Distribute, NumaMode::Isolate}) {
    auto p = k3::plan_placement(m, one, 4, 0);
    EXPECT_TRUE(p.cpus.empty());
    EXPECT_NE(p.summary.find("one NUMA node (CPUs 0-1), nothing to place"), std::string::npos) << p.summary;
  }
  EXPECT_TRUE(k3::plan_placement(NumaMode::Off, kTwoSockets, 4, 0).cpus.empty());
  EXPECT_TRUE(k3::plan_placement(NumaMode::Numactl, kTwoSockets, 4, 0).cpus.empty());
  EXPECT_EQ(k3::parse_numa_mode("distribute"), NumaMode::Distribute);
  EXPECT_FALSE(k3::parse_numa_mode("mirror").has_value());
}

// The pool binds worker t to pin[t]: worker 1 pinned to one CPU reports exactly that CPU as its mask.
TEST(Numa, PoolPinsItsWorkers) {
  const int cpu = k3::allowed_cpus().back();
  k3::ThreadPool pool(2, {{}, {cpu}});
  std::mutex mu;
  std::vector<int> seen;
  bool worker_ran = false;
  for (int attempt = 0; attempt < 200 && !worker_ran; ++attempt)
    pool.parallel_for(64, 1, [&](int64_t, int64_t, int t) {
      // chunks long enough that the worker joins the job (a job whose chunks the caller finishes before
      // the worker wakes is closed to it: thread_pool.cpp)
      if (t != 1) return std::this_thread::sleep_for(std::chrono::microseconds(20));
      cpu_set_t set;
      CPU_ZERO(&set);
      pthread_getaffinity_np(pthread_self(), sizeof set, &set);
      std::lock_guard lk(mu);
      worker_ran = true;
      seen.clear();
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) seen.push_back(c);
    });
  ASSERT_TRUE(worker_ran);
  EXPECT_EQ(seen, std::vector<int>{cpu});
}

TEST(Numa, GlobalPoolSizeIsCheckedAndFixedOnceRunning) {
  EXPECT_THROW(k3::ThreadPool::configure_global(0), k3::Error);
  EXPECT_THROW(k3::ThreadPool::configure_global(1025), k3::Error);
  k3::ThreadPool::global();
  EXPECT_THROW(k3::ThreadPool::configure_global(2), k3::Error);
  std::string source;
  EXPECT_GE(k3::ThreadPool::default_threads(&source), 1);
  EXPECT_FALSE(source.empty());
}
