// Streams one layer's host-placed routed experts to the GPU for a large batch (a long prefill chunk with
// --cpu-moe / -ot exps=CPU), where moving the weights over PCIe and computing on the tensor cores beats
// computing on the CPU: llama.cpp does the same for host weights at batch >= 32 (its op offload),
// ktransformers too. The switch point is measured (docs/perf/hybrid.md), not assumed.
//
// How: the CPU threads copy the layer's experts (as stored: MXFP4 blocks + scales, or bf16) into a pinned
// buffer laid out as the device kernels' stack ([E][rows][cols] per projection, core/weight.h
// ExpertStack), one cudaMemcpyAsync takes it to a device stack, and the grouped expert kernels run on it.
// Pinned and device buffers hold one layer and are reused; an event keeps the next layer's copy from
// overwriting a buffer the previous transfer still reads.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/host_staging.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/core/weight.h"
#include "k3/model/weights.h"

namespace k3::cuda {

class ExpertStreamer {
 public:
  // Whether the grouped kernels can run these experts as stored (MXFP4 or BF16, one format per layer).
  static bool can_stream(const std::vector<GluMlp>& experts);
  // Queues the upload of the layer on `stream`; the returned bank (device pointers) is valid for kernels
  // queued after it on that stream, until the next upload().
  ExpertBank upload(const std::vector<GluMlp>& experts, cudaStream_t stream);
  // Bytes moved by every streamer of the process so far (tests, the benchmark's PCIe figure).
  static double total_bytes_uploaded();

 private:
  PinnedBuffer pinned_;
  DeviceBuffer device_;
  CudaEvent copied_;
  bool copy_pending_ = false;
};

}  // namespace k3::cuda
