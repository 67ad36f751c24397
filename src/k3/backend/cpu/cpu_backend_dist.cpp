// CpuBackend's collectives: the activations are host memory, so they go to the communicator as they are
// (contiguous tensors) or through one staging copy.
#include <algorithm>
#include <cstring>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"

namespace k3::cpu {

using graph::Tensor;

namespace {
dist::Communicator& need(dist::Communicator* c) {
  if (c == nullptr) throw Error("a sharded step on a CPU backend without a communicator");
  return *c;
}
}  // namespace

void CpuBackend::embed_rows(const WeightMatrix& table, int64_t first, Tensor out) {
  for (int64_t t = 0; t < out.rows; ++t) {
    const int64_t row = plan_->tokens[static_cast<size_t>(t)] - first;
    if (row >= 0 && row < table.rows)
      dequant_row(table, row, out.row(t));
    else
      std::fill(out.row(t), out.row(t) + out.cols, 0.f);
  }
}

void CpuBackend::all_reduce_sum(Tensor x) {
  dist::Communicator& comm = need(comm_);
  if (x.contiguous()) {
    comm.all_reduce_sum(x.f(), static_cast<size_t>(x.count()));
    return;
  }
  std::vector<float> packed(static_cast<size_t>(x.count()));
  for (int64_t r = 0; r < x.rows; ++r) std::copy(x.row(r), x.row(r) + x.cols, packed.data() + r * x.cols);
  comm.all_reduce_sum(packed.data(), packed.size());
  for (int64_t r = 0; r < x.rows; ++r) std::copy(packed.data() + r * x.cols, packed.data() + (r + 1) * x.cols, x.row(r));
}

void CpuBackend::gather_cols(Tensor local, int64_t chunk, Tensor out) {
  dist::Communicator& comm = need(comm_);
  const int64_t n = out.rows, P = comm.size();
  if (local.rows != n || local.cols > chunk || chunk * P < out.cols)
    throw Error("gather_cols: a local [" + std::to_string(local.rows) + "][" + std::to_string(local.cols) +
                "] in chunks of " + std::to_string(chunk) + " does not make [" + std::to_string(n) + "][" +
                std::to_string(out.cols) + "]");
  // Every rank sends [n][chunk] (the last rank's padding is zeros); rank r's columns land at r * chunk.
  const bool root = comm.is_root();
  std::vector<float> send(static_cast<size_t>(n * chunk), 0.f), recv(root ? static_cast<size_t>(P * n * chunk) : 0);
  for (int64_t r = 0; r < n; ++r) std::copy(local.row(r), local.row(r) + local.cols, send.data() + r * chunk);
  comm.gather(send.data(), send.size() * sizeof(float), root ? recv.data() : nullptr, 0);
  if (!root) return;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t c0 = p * chunk, w = std::min(chunk, out.cols - c0);
    if (w <= 0) break;
    for (int64_t r = 0; r < n; ++r) {
      const float* src = recv.data() + (p * n + r) * chunk;
      std::copy(src, src + w, out.row(r) + c0);
    }
  }
}

void CpuBackend::moe_keep_experts(Tensor idx, int64_t first, int64_t count) {
  int32_t* p = idx.i();
  for (int64_t r = 0; r < idx.rows; ++r)
    for (int64_t j = 0; j < idx.cols; ++j) {
      int32_t& e = p[r * idx.stride + j];
      e = (e >= first && e < first + count) ? static_cast<int32_t>(e - first) : -1;
    }
}

}  // namespace k3::cpu
