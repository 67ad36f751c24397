// Device logits rows -> a caller's (pageable) host array, fast enough that batched decode is not bound by it.
//
// Why: forward_batch returns R x V fp32 logits (R x 0.65 MB at V = 163840). The old path was one D2H copy
// into pinned memory, a stream sync, then one single-threaded memcpy into the caller's vector: at batch 128
// 84 MB went through one core after the PCIe copy had finished, serially (issue 18: the batched decode
// steps of the Kimi-Linear slice grew by ~0.1 ms per sequence). Here the rows go down in pieces of ~4 MB,
// each followed by an event, and while piece p+1 is on the bus the host copies piece p out of pinned memory
// with the CPU thread pool, so the step costs about max(PCIe copy, host copy) plus one piece.
// The bytes delivered are the same (a copy); only the order of the work changes.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "k3/backend/cuda/host_staging.h"

namespace k3::cuda {

class LogitsDownload {
 public:
  // Pipelined (default) or the old serial path (one copy, sync, one memcpy): K3_CUDA_LOGITS_COPY=serial,
  // kept for same-binary A/B measurements.
  LogitsDownload();

  // Copies `bytes` from device `src` to host `dst` after the work already queued on `stream`; returns when
  // dst holds them. `bytes` is split at multiples of `unit` (a logits row) so a piece is whole rows.
  void copy(const void* src, size_t bytes, size_t unit, void* dst, cudaStream_t stream);

  // How many pieces a copy of `bytes` in units of `unit` is cut into (at most kMaxPieces, each >= 1 unit).
  static size_t pieces_for(size_t bytes, size_t unit);
  static constexpr size_t kPieceBytes = 4u << 20;
  static constexpr size_t kMaxPieces = 64;

 private:
  bool serial_ = false;
  PinnedBuffer pinned_;
  std::vector<CudaEvent> events_;
};

}  // namespace k3::cuda
