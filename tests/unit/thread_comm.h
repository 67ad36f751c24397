// A communicator between threads of one process (tests only): N "ranks" that meet at a barrier per
// collective, so that the sharded model runs in k3_tests without MPI.
#pragma once
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "k3/core/error.h"
#include "k3/dist/communicator.h"

namespace k3test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), sync_(n), ptr_(static_cast<size_t>(n)), bytes_(static_cast<size_t>(n)) {}
  int size() const { return n_; }
  std::barrier<>& sync() { return sync_; }
  std::vector<const void*>& ptr() { return ptr_; }
  std::vector<size_t>& bytes() { return bytes_; }

 private:
  int n_;
  std::barrier<> sync_;
  std::vector<const void*> ptr_;
  std::vector<size_t> bytes_;
};

class ThreadComm final : public k3::dist::Communicator {
 public:
  ThreadComm(std::shared_ptr<ThreadGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string name() const override { return "threads"; }
  void all_reduce_sum(float* x, size_t n) override {
    publish(x, n);
    std::vector<float> sum(n, 0.f);
    for (int r = 0; r < size(); ++r) {  // rank order, as MpiComm
      const float* p = static_cast<const float*>(g_->ptr()[r]);
      for (size_t i = 0; i < n; ++i) sum[i] = r == 0 ? p[i] : sum[i] + p[i];
    }
    g_->sync().arrive_and_wait();
    std::memcpy(x, sum.data(), n * sizeof(float));
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    publish(send, bytes);
    for (int r = 0; r < size(); ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, g_->ptr()[r], bytes);
    g_->sync().arrive_and_wait();
  }
  void gather(const void* send, size_t bytes, void* recv, int root) override {
    publish(send, bytes);
    if (rank_ == root)
      for (int r = 0; r < size(); ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, g_->ptr()[r], bytes);
    g_->sync().arrive_and_wait();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    publish(data, bytes);
    if (rank_ != root) std::memcpy(data, g_->ptr()[root], bytes);
    g_->sync().arrive_and_wait();
  }
  void all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>) override {
    throw k3::Error("ThreadComm: no all_to_all_v");
  }
  void barrier() override { g_->sync().arrive_and_wait(); }
  [[noreturn]] void abort(int) override { std::abort(); }

 private:
  void publish(const void* p, size_t bytes) {
    g_->ptr()[rank_] = p;
    g_->bytes()[rank_] = bytes;
    g_->sync().arrive_and_wait();
  }
  std::shared_ptr<ThreadGroup> g_;
  int rank_;
};

}  // namespace k3test
