// CpuBackend: step, scratch, dense ops and the Attention-Residual mix (KDA, MLA and MoE ops are in
// cpu_backend_{kda,mla,moe}.cpp).
#include "k3/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "k3/backend/cpu/block_attention.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"

namespace k3::cpu {

using graph::Tensor;

namespace {
void need_contiguous(const Tensor& t, const char* op) {
  if (!t.contiguous()) throw Error(std::string("cpu backend: ") + op + " needs contiguous rows");
}
}  // namespace

void CpuBackend::begin_step(const graph::StepPlan& plan) {
  plan_ = &plan;
  arena_.reset();
  prof_.step_boundary();
}

Tensor CpuBackend::scratch(int64_t rows, int64_t cols, graph::ElemType type) {
  void* p = arena_.take(static_cast<size_t>(std::max<int64_t>(rows * cols, 1)) * 4);
  return Tensor{p, rows, cols, cols, type};
}

void CpuBackend::embed(const WeightMatrix& table, Tensor out) {
  CpuOpProfile::Scope ps(prof_, "embed");
  for (int64_t t = 0; t < out.rows; ++t) dequant_row(table, plan_->tokens[static_cast<size_t>(t)], out.row(t));
}

void CpuBackend::linear(const WeightMatrix& W, Tensor x, Tensor y) {
  need_contiguous(x, "linear");
  need_contiguous(y, "linear");
  if (x.cols != W.cols || y.cols != W.rows || x.rows != y.rows) throw Error("cpu backend: linear shape mismatch");
  if (observer_) observer_->on_linear_input(W, x.f(), x.rows);
  // Profiled per shape, format and decode / batch: a decode step streams each matrix once.
  CpuOpProfile::Scope ps(
      prof_,
      [&] {
        return "linear " + std::to_string(W.rows) + "x" + std::to_string(W.cols) + " " + weight_format_name(W.format) +
               (x.rows == 1 ? " n=1" : " n>1");
      },
      W.bytes());
  matmul(W, x.f(), x.rows, y.f());
}

namespace {
// Up to this many tokens a projection group runs as one matmul_batch; above it each projection's own matmul
// (the amx tier packs its token tiles once per matmul, which matmul_batch's per-block rows() would redo).
// The same bits either way: matmul_batch gives every job the bytes matmul gives it alone.
constexpr int64_t kGroupMaxTokens = 16;
// K3_CPU_LINEAR_GROUP=0: one matmul per projection (the A/B switch of the measurement; same bits).
bool group_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("K3_CPU_LINEAR_GROUP");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}
}  // namespace

void CpuBackend::linear_group(Tensor x, std::span<const graph::Projection> ps) {
  if (observer_ != nullptr || ps.size() < 2 || x.rows > kGroupMaxTokens || !group_enabled())
    return graph::Backend::linear_group(x, ps);
  need_contiguous(x, "linear_group");
  std::vector<MatmulJob> jobs;
  int64_t bytes = 0;
  for (const graph::Projection& p : ps) {
    need_contiguous(p.y, "linear_group");
    if (x.cols != p.W->cols || p.y.cols != p.W->rows || x.rows != p.y.rows) throw Error("cpu backend: linear_group shape mismatch");
    jobs.push_back({p.W, x.f(), x.rows, p.y.f()});
    bytes += p.W->bytes();
  }
  CpuOpProfile::Scope prof(
      prof_, [&] { return "linear_group x" + std::to_string(ps.size()) + (x.rows == 1 ? " n=1" : " n>1"); }, bytes);
  matmul_batch(jobs);
}

void CpuBackend::linear_batch(std::span<const graph::LinearJob> jobs) {
  bool few = jobs.size() >= 2;
  for (const graph::LinearJob& j : jobs) few = few && j.x.rows <= kGroupMaxTokens;
  if (observer_ != nullptr || !few || !group_enabled()) return graph::Backend::linear_batch(jobs);
  std::vector<MatmulJob> mj;
  int64_t bytes = 0;
  for (const graph::LinearJob& j : jobs) {
    need_contiguous(j.x, "linear_batch");
    need_contiguous(j.y, "linear_batch");
    if (j.x.cols != j.W->cols || j.y.cols != j.W->rows || j.x.rows != j.y.rows) throw Error("cpu backend: linear_batch shape mismatch");
    mj.push_back({j.W, j.x.f(), j.x.rows, j.y.f()});
    bytes += j.W->bytes();
  }
  CpuOpProfile::Scope prof(
      prof_, [&] { return "linear_batch x" + std::to_string(jobs.size()) + (jobs[0].x.rows == 1 ? " n=1" : " n>1"); }, bytes);
  matmul_batch(mj);
}

void CpuBackend::rmsnorm(Tensor x, const float* w, int64_t dim, float eps, Tensor y) {
  CpuOpProfile::Scope ps(prof_, "rmsnorm");
  if (x.stride != y.stride || x.rows != y.rows) throw Error("cpu backend: rmsnorm layouts differ");
  if (dim == x.stride)
    cpu::rmsnorm(x.f(), w, x.rows, dim, eps, y.f());
  else
    cpu::rmsnorm(x.f(), w, x.rows, dim, eps, x.stride, y.f());
}

void CpuBackend::glu(Tensor gate, Tensor up, const graph::GluParams& p) {
  CpuOpProfile::Scope ps(prof_, "glu");
  need_contiguous(gate, "glu");
  need_contiguous(up, "glu");
  if (p.situ)
    situ_glu(gate.f(), up.f(), gate.count(), p.beta, p.linear_beta, gate.f());
  else
    silu_glu(gate.f(), up.f(), gate.count(), gate.f());
}

void CpuBackend::add(Tensor y, Tensor x) {
  CpuOpProfile::Scope ps(prof_, "add");
  float* a = y.f();
  const float* b = x.f();
  const int64_t n = y.count();
  constexpr int64_t kChunk = 16384;  // in parallel at prefill sizes (the residual adds: 1 M values at pp512)
  parallel_for((n + kChunk - 1) / kChunk, n > 4 * kChunk, [&](int64_t c) {
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) a[i] += b[i];
  });
}

void CpuBackend::copy(Tensor dst, Tensor src) {
  CpuOpProfile::Scope ps(prof_, "copy");
  if (dst.rows != src.rows || dst.cols != src.cols) throw Error("cpu backend: copy shapes differ");
  if (dst.contiguous() && src.contiguous()) return (void)std::copy(src.f(), src.f() + src.count(), dst.f());
  for (int64_t r = 0; r < dst.rows; ++r) std::copy(src.row(r), src.row(r) + src.cols, dst.row(r));  // strided / broadcast
}

void CpuBackend::sigmoid_mul(Tensor y, Tensor g) {
  CpuOpProfile::Scope ps(prof_, "sigmoid_mul");
  cpu::sigmoid_mul(y.f(), g.f(), y.count());
}

void CpuBackend::gather_logit_rows(Tensor h, Tensor out) {
  CpuOpProfile::Scope ps(prof_, "gather_logit_rows");
  for (int64_t r = 0; r < out.rows; ++r) {
    const float* src = h.row(plan_->logit_rows[static_cast<size_t>(r)]);
    std::copy(src, src + h.cols, out.row(r));
  }
}

void CpuBackend::block_attention(Tensor q, Tensor k, Tensor v, int64_t block, int64_t heads, int64_t head_dim,
                                 float scale, Tensor o) {
  CpuOpProfile::Scope ps(prof_, "block_attention");
  for (const Tensor* t : {&q, &k, &v, &o}) {
    need_contiguous(*t, "block_attention");
    if (t->rows != q.rows || t->cols != heads * head_dim) throw Error("cpu backend: block_attention shapes differ");
  }
  if (block < 1 || q.rows % block != 0)
    throw Error("cpu backend: block_attention over " + std::to_string(q.rows) + " rows in blocks of " + std::to_string(block));
  cpu::block_attention(q.f(), k.f(), v.f(), q.rows, block, heads, head_dim, scale, o.f());
}

namespace {
// Per source i < M: ss[i] = sum_d v_i[d]^2 and dot[i] = sum_d v_i[d] w[d] in double, d ascending -- each sum the same
// sequential chain as one source at a time (so the same bits), but the 2 M chains interleaved: a decode row's
// sums were ~2.7 us of dependent double adds per source (H = 2048), ~11 us per AttnRes mix at four sources.
template <int M>
void source_sums(const float* const* v, int64_t t, int64_t H, const float* w, double* ss, double* dot) {
  double s[M], q[M];
  const float* r[M];
  for (int i = 0; i < M; ++i) s[i] = 0, q[i] = 0, r[i] = v[i] + t * H;
  for (int64_t d = 0; d < H; ++d) {
    const double wd = w[d];
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const double x = r[i][d];
      s[i] += x * x;
      q[i] += x * wd;
    }
  }
  for (int i = 0; i < M; ++i) ss[i] = s[i], dot[i] = q[i];
}

void source_sums_any(const float* const* v, size_t m, int64_t t, int64_t H, const float* w, double* ss, double* dot) {
  for (size_t i0 = 0; i0 < m; i0 += 8) {
    const float* const* vi = v + i0;
    double* a = ss + i0;
    double* b = dot + i0;
    switch (std::min<size_t>(8, m - i0)) {
      case 1: source_sums<1>(vi, t, H, w, a, b); break;
      case 2: source_sums<2>(vi, t, H, w, a, b); break;
      case 3: source_sums<3>(vi, t, H, w, a, b); break;
      case 4: source_sums<4>(vi, t, H, w, a, b); break;
      case 5: source_sums<5>(vi, t, H, w, a, b); break;
      case 6: source_sums<6>(vi, t, H, w, a, b); break;
      case 7: source_sums<7>(vi, t, H, w, a, b); break;
      default: source_sums<8>(vi, t, H, w, a, b); break;
    }
  }
}
}  // namespace

// Tokens are independent: in parallel over them when there is enough work (prefill), each token computed
// the same way on any thread.
void CpuBackend::attn_res_mix(Tensor blocks, int64_t nb, Tensor partial, const float* w, float eps, Tensor out) {
  CpuOpProfile::Scope ps(prof_, "attn_res_mix");
  const int64_t n = partial.rows, H = partial.cols;
  std::vector<const float*> src;
  for (int64_t b = 0; b < nb; ++b) src.push_back(blocks.row(b * n));
  src.push_back(partial.f());
  const size_t m = src.size();
  parallel_for(n, n * static_cast<int64_t>(m) * H > 65536, [&](int64_t t) {
    float score[64];
    double ss[64], dot[64];
    std::vector<float> big;
    std::vector<double> bigd;
    float* sc = score;
    double* pss = ss;
    double* pdot = dot;
    if (m > 64) {
      big.resize(m);
      bigd.resize(2 * m);
      sc = big.data(), pss = bigd.data(), pdot = bigd.data() + m;
    }
    source_sums_any(src.data(), m, t, H, w, pss, pdot);
    float mx = -INFINITY;
    for (size_t i = 0; i < m; ++i) {
      const float inv = 1.0f / std::sqrt(static_cast<float>(pss[i] / static_cast<double>(H)) + eps);
      sc[i] = static_cast<float>(pdot[i]) * inv;
      mx = std::max(mx, sc[i]);
    }
    float sum = 0;
    for (size_t i = 0; i < m; ++i) sum += (sc[i] = std::exp(sc[i] - mx));
    float* o = out.row(t);
    for (int64_t d = 0; d < H; ++d) o[d] = 0;
    for (size_t i = 0; i < m; ++i) {
      const float p = sc[i] / sum;
      const float* v = src[i] + t * H;
      for (int64_t d = 0; d < H; ++d) o[d] += p * v[d];
    }
  });
}

}  // namespace k3::cpu
