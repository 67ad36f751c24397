#include "k3/backend/cuda/logits_download.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "k3/core/thread_pool.h"

namespace k3::cuda {
namespace {

// Host copy of one piece, split over the CPU pool in 1 MiB slices (the pool's workers are idle while the
// GPU runs a step; small pieces stay on the calling thread).
void host_copy(char* dst, const char* src, size_t bytes) {
  constexpr size_t kSlice = 1u << 20;
  const int64_t slices = static_cast<int64_t>((bytes + kSlice - 1) / kSlice);
  if (slices <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  ThreadPool::global().parallel_for(slices, 1, [&](int64_t b, int64_t e, int) {
    const size_t lo = static_cast<size_t>(b) * kSlice, hi = std::min(bytes, static_cast<size_t>(e) * kSlice);
    std::memcpy(dst + lo, src + lo, hi - lo);
  });
}

}  // namespace

LogitsDownload::LogitsDownload() {
  const char* mode = std::getenv("K3_CUDA_LOGITS_COPY");
  serial_ = mode != nullptr && std::string(mode) == "serial";
}

size_t LogitsDownload::pieces_for(size_t bytes, size_t unit) {
  if (bytes == 0) return 0;
  unit = std::max<size_t>(unit, 1);
  const size_t units = (bytes + unit - 1) / unit;
  const size_t per_piece = std::max<size_t>(1, kPieceBytes / unit);
  size_t pieces = (units + per_piece - 1) / per_piece;
  return std::min(pieces, std::min(kMaxPieces, units));
}

void LogitsDownload::copy(const void* src, size_t bytes, size_t unit, void* dst, cudaStream_t stream) {
  if (bytes == 0) return;
  char* pinned = static_cast<char*>(pinned_.ensure(bytes));
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  if (serial_) {
    K3_CUDA_CHECK(cudaMemcpyAsync(pinned, s, bytes, cudaMemcpyDeviceToHost, stream));
    K3_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::memcpy(d, pinned, bytes);
    return;
  }
  unit = std::max<size_t>(unit, 1);
  const size_t pieces = pieces_for(bytes, unit);
  const size_t units = (bytes + unit - 1) / unit;
  const size_t units_per_piece = (units + pieces - 1) / pieces;
  if (events_.size() < pieces) events_ = std::vector<CudaEvent>(pieces);
  auto piece_range = [&](size_t p, size_t& lo, size_t& hi) {
    lo = std::min(bytes, p * units_per_piece * unit);
    hi = std::min(bytes, (p + 1) * units_per_piece * unit);
  };
  for (size_t p = 0; p < pieces; ++p) {
    size_t lo, hi;
    piece_range(p, lo, hi);
    if (hi > lo) K3_CUDA_CHECK(cudaMemcpyAsync(pinned + lo, s + lo, hi - lo, cudaMemcpyDeviceToHost, stream));
    K3_CUDA_CHECK(cudaEventRecord(events_[p].get(), stream));
  }
  for (size_t p = 0; p < pieces; ++p) {
    size_t lo, hi;
    piece_range(p, lo, hi);
    K3_CUDA_CHECK(cudaEventSynchronize(events_[p].get()));
    if (hi > lo) host_copy(d + lo, pinned + lo, hi - lo);
  }
}

}  // namespace k3::cuda
