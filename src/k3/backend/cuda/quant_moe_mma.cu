// quant_moe_mma (quant_moe.h): routed GGUF K-quant experts at decode batches on the tensor cores.
//
// Why: quant_moe_grouped reads each touched expert once per tile of 2 pairs in fp32 on the CUDA cores, ~0.7 TB/s at
// one token and 1.5 ms a layer at 64 tokens of the Kimi-Linear shape (256 x 2304 x 1024, top 8; docs/perf/cuda.md
// session 19): at batch 8 the three MoE layers were ~half of a Q4_K_M decode step. Here a tile of up to 8 pairs of one
// expert is one n8 column block of quant_mma.cuh's kernel (the dense block GEMV's decoders and numerics):
//   prep x (by token: hi / lo / 32-column sums) -> gate+up (MT = 2: m16 tile 0 the gate rows, 1 the same up rows; the
//   GLU on the reduced sums; hidden by slot) -> prep hidden (by slot) -> down (by slot) -> moe_combine (rank order).
// A tile's B column j is slot s0 + j; gate / up read token sorted[s] / K of x, down reads the slot's hidden row.
// Every output depends only on its own pair's row and the expert's weights (columns of an MMA are independent, the
// reduction tree is fixed): results do not depend on which tile a pair lands in.
#include "k3/backend/cuda/moe_decode.h"
#include "k3/backend/cuda/quant_moe.h"
#include "k3/backend/cuda/quant_mma.cuh"
#include "k3/backend/cuda/quant_tables.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace k3::cuda {
namespace {

struct ExpertLaunch {
  const qmma::Job& j;
  bool glu, split;
  int tiles_bound;
  cudaStream_t s;
  template <class P>
  cudaError_t run() const {
    if (glu) return split ? qmma::launch<P, 1, 2, true, true, true>(j, tiles_bound, s) : qmma::launch<P, 1, 2, false, true, true>(j, tiles_bound, s);
    return split ? qmma::launch<P, 1, 1, true, false, true>(j, tiles_bound, s) : qmma::launch<P, 1, 1, false, false, true>(j, tiles_bound, s);
  }
};

std::atomic<int> g_override{-2};  // -2: not set, K3_QUANT_MOE_MMA decides

}  // namespace

void quant_moe_mma_override(int on) { g_override.store(on < 0 ? -2 : on != 0, std::memory_order_relaxed); }

int quant_moe_mma_mode() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  static const int env = [] {
    const char* e = std::getenv("K3_QUANT_MOE_MMA");
    return e == nullptr || e[0] == 0 ? -1 : std::strcmp(e, "0") == 0 ? 0 : 1;
  }();
  return env;
}

bool quant_moe_mma_supported(const ExpertStack& w) {
  if (w.I <= 0 || w.X <= 0) return false;
  const WeightFormat df = expert_down_format(w);
  const int64_t gu = row_data_bytes(w.format, w.X), dn = row_data_bytes(df, w.I);
  return qmma::rows_ok(w.format, w.gate, gu, w.X) && qmma::rows_ok(w.format, w.up, gu, w.X) && qmma::rows_ok(df, w.down, dn, w.I);
}

cudaError_t quant_moe_mma(const ExpertStack& w, int n, int K, const float* x, const int32_t* sorted, const int32_t* slot_of,
                          const int4* tiles, const int32_t* num_tiles, int tiles_bound, const float* topk_w, GluAct act,
                          float beta, float lbeta, bool split, uint16_t* xb, uint16_t* hb, float* sums, float* hidden,
                          float* y, float* out, cudaStream_t s) {
  if (!quant_moe_mma_supported(w) || n < 0 || K <= 0 || tiles_bound < 0) return cudaErrorInvalidValue;
  if (n == 0 || tiles_bound == 0) return cudaSuccess;
  const int P = n * K;
  const int64_t ldx_x = quant_mma_ldx(n), ldx_h = quant_mma_ldx(P);
  cudaError_t e = qmma::prep(x, n, ldx_x, w.X, xb, split ? xb + static_cast<int64_t>(n) * w.X : nullptr, sums, s);
  if (e != cudaSuccess) return e;
  qmma::Job j;
  j.w0 = static_cast<const uint8_t*>(w.gate);
  j.w1 = static_cast<const uint8_t*>(w.up);
  j.rows = w.I;
  j.row_bytes = row_data_bytes(w.format, w.X);
  j.expert_bytes = j.rows * j.row_bytes;
  j.a = QuantMmaActs{xb, split ? xb + static_cast<int64_t>(n) * w.X : nullptr, sums, n, w.X};
  j.ldx = ldx_x;
  j.tiles = tiles, j.num_tiles = num_tiles;
  j.sorted = sorted, j.K = K;
  j.y = hidden;
  j.act = act, j.beta = beta, j.lbeta = lbeta;
  if ((e = qmma::with_mma_format(w.format, ExpertLaunch{j, true, split, tiles_bound, s})) != cudaSuccess) return e;
  uint16_t* hlo = split ? hb + static_cast<int64_t>(P) * w.I : nullptr;
  if ((e = qmma::prep(hidden, P, ldx_h, w.I, hb, hlo, sums, s)) != cudaSuccess) return e;
  const WeightFormat df = expert_down_format(w);
  qmma::Job d = j;
  d.w0 = static_cast<const uint8_t*>(w.down), d.w1 = nullptr;
  d.rows = w.X;
  d.row_bytes = row_data_bytes(df, w.I);
  d.expert_bytes = d.rows * d.row_bytes;
  d.a = QuantMmaActs{hb, hlo, sums, P, w.I};
  d.ldx = ldx_h;
  d.sorted = nullptr;
  d.y = y;
  if ((e = qmma::with_mma_format(df, ExpertLaunch{d, false, split, tiles_bound, s})) != cudaSuccess) return e;
  return moe_combine(n, w.X, K, y, 0, 1, slot_of, topk_w, out, s);
}

}  // namespace k3::cuda
