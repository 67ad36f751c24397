#include "k3/backend/cuda/step_graphs.h"

#include "k3/backend/cuda/cuda_util.h"

namespace k3::cuda {

void StepGraphs::clear() {
  for (auto& [k, e] : graphs_) destroy(e);
  graphs_.clear();
}

void StepGraphs::destroy(Entry& e) {
  for (cudaGraphExec_t x : e.pieces)
    if (x) cudaGraphExecDestroy(x);
  e.pieces.clear();
  e.host_jobs.clear();
}

void StepGraphs::launch(const Entry& e, cudaStream_t stream) {
  for (size_t i = 0; i < e.pieces.size(); ++i) {
    K3_CUDA_CHECK(cudaGraphLaunch(e.pieces[i], stream));
    if (i < e.host_jobs.size()) e.host_jobs[i]();
  }
}

StepGraphs::Entry StepGraphs::capture(CudaBackend& backend, cudaStream_t stream, bool host_cuts,
                                      const std::function<void()>& enqueue) {
  std::vector<CudaBackend::HostCut> cuts;
  cudaGraph_t last = nullptr;
  auto drop_pieces = [&] {
    for (auto& c : cuts)
      if (c.piece) cudaGraphDestroy(c.piece);
    if (last) cudaGraphDestroy(last);
  };
  K3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  if (host_cuts) backend.begin_host_cuts(&cuts);
  try {
    enqueue();
  } catch (...) {
    backend.end_host_cuts();
    cudaStreamEndCapture(stream, &last);
    drop_pieces();
    throw;
  }
  backend.end_host_cuts();
  const cudaError_t end = cudaStreamEndCapture(stream, &last);
  if (end != cudaSuccess) {
    drop_pieces();
    K3_CUDA_CHECK(end);
  }
  Entry e;
  std::vector<cudaGraph_t> graphs;
  for (auto& c : cuts) {
    graphs.push_back(c.piece);
    e.host_jobs.push_back(std::move(c.host_job));
  }
  graphs.push_back(last);
  cudaError_t err = cudaSuccess;
  for (cudaGraph_t g : graphs) {
    cudaGraphExec_t x = nullptr;
    if (err == cudaSuccess) err = cudaGraphInstantiate(&x, g, 0);
    if (x) e.pieces.push_back(x);
    cudaGraphDestroy(g);
  }
  if (err != cudaSuccess) {
    destroy(e);
    K3_CUDA_CHECK(err);
  }
  return e;
}

void StepGraphs::run(const Key& key, CudaBackend& backend, cudaStream_t stream, bool host_cuts,
                     const std::function<void()>& enqueue) {
  const uint64_t gen = backend.generation();
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second.generation == gen) {
    ++replays_;
    return launch(it->second, stream);
  }
  if (!seen_.count(key)) {
    seen_.insert(key);
    return enqueue();
  }
  if (it != graphs_.end()) {  // stale: a buffer it refers to was reallocated
    destroy(it->second);
    graphs_.erase(it);
  }
  Entry e = capture(backend, stream, host_cuts, enqueue);
  if (backend.generation() != gen) {  // the capture itself grew a buffer: run eagerly this once
    destroy(e);
    return enqueue();
  }
  e.generation = gen;
  ++replays_;
  launch(graphs_[key] = std::move(e), stream);
}

}  // namespace k3::cuda
