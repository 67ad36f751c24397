// CpuBackend's collectives: the activations are host memory, so they go to the communicator as they are
// (contiguous tensors) or through one staging copy.
#include <algorithm>
#include <cstring>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/dist/shard_plan.h"

namespace k3::cpu {

using graph::Tensor;

void CpuBackend::embed_rows(const WeightMatrix& table, int64_t first, Tensor out) {
  CpuOpProfile::Scope ps(prof_, "embed_rows");
  for (int64_t t = 0; t < out.rows; ++t) {
    const int64_t row = plan_->tokens[static_cast<size_t>(t)] - first;
    if (row >= 0 && row < table.rows)
      dequant_row(table, row, out.row(t));
    else
      std::fill(out.row(t), out.row(t) + out.cols, 0.f);
  }
}

void CpuBackend::all_reduce_sum(Tensor x) {
  CpuOpProfile::Scope ps(prof_, "all_reduce_sum");
  dist::Communicator& comm = dist::need_communicator(comm_, "a CPU backend");
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
  CpuOpProfile::Scope ps(prof_, "gather_cols");
  dist::Communicator& comm = dist::need_communicator(comm_, "a CPU backend");
  const int64_t n = out.rows, P = comm.size();
  dist::check_gather_cols(local.rows, local.cols, chunk, P, n, out.cols);
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

void CpuBackend::moe_keep_experts(Tensor idx, const dist::ShardPlan& shard) {
  CpuOpProfile::Scope ps(prof_, "moe_keep_experts");
  int32_t* p = idx.i();
  for (int64_t r = 0; r < idx.rows; ++r)
    for (int64_t j = 0; j < idx.cols; ++j) {
      int32_t& e = p[r * idx.stride + j];
      e = shard.local_expert(e);
    }
}

// A dispatched row: the expert (its index on the receiving rank), the routing weight, then x's row.
// Floats throughout so that one all_to_all_v moves it (the index travels bit-cast).
void CpuBackend::moe_experts_all_to_all(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& gp,
                                        Tensor out, const dist::ShardPlan& shard) {
  CpuOpProfile::Scope ps(prof_, "moe_experts_all_to_all");
  dist::Communicator& comm = dist::need_communicator(comm_, "a CPU backend");
  const int P = comm.size(), me = comm.rank();
  const int64_t N = x.rows, K = idx.cols, X = x.cols, Y = out.cols, row = X + 2;
  const int64_t t0 = N * me / P, t1 = N * (me + 1) / P;  // this rank's tokens
  // Sort this rank's (token, k) pairs by owner, keeping the order within an owner.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> to(static_cast<size_t>(P));
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = idx.i()[t * idx.stride + j];
      to[static_cast<size_t>(shard.owner_of_expert(e))].push_back({t, j});
    }
  std::vector<int64_t> counts(static_cast<size_t>(P)), all(static_cast<size_t>(P * P));
  for (int r = 0; r < P; ++r) counts[static_cast<size_t>(r)] = static_cast<int64_t>(to[static_cast<size_t>(r)].size());
  comm.all_gather(counts.data(), counts.size() * sizeof(int64_t), all.data());  // all[s][r]: rows s sends r
  std::vector<size_t> send_bytes(static_cast<size_t>(P)), recv_bytes(static_cast<size_t>(P));
  int64_t n_in = 0;
  for (int r = 0; r < P; ++r) {
    send_bytes[static_cast<size_t>(r)] = static_cast<size_t>(counts[static_cast<size_t>(r)] * row) * sizeof(float);
    const int64_t in = all[static_cast<size_t>(r * P + me)];
    recv_bytes[static_cast<size_t>(r)] = static_cast<size_t>(in * row) * sizeof(float);
    n_in += in;
  }
  std::vector<float> send, recv(static_cast<size_t>(n_in * row));
  send.reserve(static_cast<size_t>((t1 - t0) * K * row));
  for (const auto& pairs : to)
    for (const auto& [t, j] : pairs) {
      const int32_t local = shard.index_on_owner(idx.i()[t * idx.stride + j]);
      float tag;
      std::memcpy(&tag, &local, sizeof tag);
      send.push_back(tag);
      send.push_back(wts.f()[t * wts.stride + j]);
      send.insert(send.end(), x.row(t), x.row(t) + X);
    }
  comm.all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
  // This rank's experts on what it received: one expert per row, weighted.
  std::vector<float> xin(static_cast<size_t>(n_in * X)), win(static_cast<size_t>(n_in)), yin(static_cast<size_t>(n_in * Y));
  std::vector<int32_t> ein(static_cast<size_t>(n_in));
  for (int64_t i = 0; i < n_in; ++i) {
    const float* r = recv.data() + i * row;
    std::memcpy(&ein[static_cast<size_t>(i)], &r[0], sizeof(int32_t));
    if (ein[static_cast<size_t>(i)] < 0 || ein[static_cast<size_t>(i)] >= static_cast<int32_t>(w.experts.size()))
      throw Error("moe_experts_all_to_all: a row for expert " + std::to_string(ein[static_cast<size_t>(i)]) +
                  " this rank does not hold");
    win[static_cast<size_t>(i)] = r[1];
    std::copy(r + 2, r + row, xin.data() + i * X);
  }
  if (n_in > 0)
    moe_experts(w, Tensor::f32(xin.data(), n_in, X), Tensor::i32(ein.data(), n_in, 1), Tensor::f32(win.data(), n_in, 1), gp,
                Tensor::f32(yin.data(), n_in, Y));
  // Combine: the results go back the way the rows came.
  std::vector<float> back(static_cast<size_t>((t1 - t0) * K * Y));
  for (int r = 0; r < P; ++r) {
    send_bytes[static_cast<size_t>(r)] = static_cast<size_t>(all[static_cast<size_t>(r * P + me)] * Y) * sizeof(float);
    recv_bytes[static_cast<size_t>(r)] = static_cast<size_t>(counts[static_cast<size_t>(r)] * Y) * sizeof(float);
  }
  comm.all_to_all_v(yin.data(), send_bytes, back.data(), recv_bytes);
  // Each of this rank's tokens: its K results summed in routing order; the other tokens zero.
  std::vector<float> by_k(static_cast<size_t>((t1 - t0) * K * Y));
  size_t at = 0;
  for (const auto& pairs : to)
    for (const auto& [t, j] : pairs) {
      std::copy(back.data() + at * Y, back.data() + (at + 1) * Y, by_k.data() + ((t - t0) * K + j) * Y);
      ++at;
    }
  for (int64_t t = 0; t < N; ++t) {
    float* o = out.row(t);
    std::fill(o, o + Y, 0.f);
    if (t < t0 || t >= t1) continue;
    for (int64_t j = 0; j < K; ++j) {
      const float* y = by_k.data() + ((t - t0) * K + j) * Y;
      for (int64_t c = 0; c < Y; ++c) o[c] += y[c];
    }
  }
}

}  // namespace k3::cpu
