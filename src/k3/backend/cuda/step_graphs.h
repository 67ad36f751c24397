// Decode steps replayed as CUDA graphs (CudaModel): keyed by (sequences, page-table stride), captured the
// second time a key is seen (the first, eager run sizes every lazily grown buffer), dropped when a buffer
// they refer to moves (CudaBackend::generation). A step whose routed experts run on the host is captured
// in pieces cut at each host expert job (CudaBackend::begin_host_cuts) and replayed as piece, job, piece,
// ..., so the GPU's segments between the CPU's jobs run as graphs too (docs/perf/hybrid.md).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <array>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "k3/backend/cuda/cuda_backend.h"

namespace k3::cuda {

class StepGraphs {
 public:
  using Key = std::vector<int64_t>;  // CudaBackend::graph_key()
  StepGraphs() = default;
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  ~StepGraphs() { clear(); }

  // Runs one step: replays the key's graph if it is current, else runs `enqueue` eagerly (first sight of
  // the key, or the capture itself moved a buffer) or captures and launches it (second sight). `host_cuts`:
  // capture in pieces at the backend's host expert jobs.
  void run(const Key& key, CudaBackend& backend, cudaStream_t stream, bool host_cuts, const std::function<void()>& enqueue);
  // Steps run as graph launches so far (tests assert the graph path was taken).
  int64_t replays() const { return replays_; }
  void clear();

 private:
  struct Entry {
    std::vector<cudaGraphExec_t> pieces;            // launched in order
    std::vector<std::function<void()>> host_jobs;   // job i runs on the host after piece i's launch
    uint64_t generation = 0;
  };
  static void launch(const Entry& e, cudaStream_t stream);
  static void destroy(Entry& e);
  // Captures `enqueue` (in pieces with host_cuts) and instantiates it; throws after cleaning up.
  static Entry capture(CudaBackend& backend, cudaStream_t stream, bool host_cuts, const std::function<void()>& enqueue);

  std::map<Key, Entry> graphs_;
  std::set<Key> seen_;
  int64_t replays_ = 0;
};

}  // namespace k3::cuda
