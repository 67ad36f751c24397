// CpuBackend's KDA ops (model-spec 3.2) over the recurrence cores of kda.h: conv + L2 norms and the
// recurrence run per sequence on that sequence's state; gates and the output gate per element.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/vec_math.h"

namespace k3::cpu {

using graph::Tensor;

namespace {

// x / sqrt(sum x^2 + 1e-6) * scale, per head of D values.
void l2norm_heads(float* x, int64_t rows, int64_t D, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * D;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(v[d]) * v[d];
    const float inv = scale / std::sqrt(static_cast<float>(ss) + 1e-6f);
    for (int64_t d = 0; d < D; ++d) v[d] *= inv;
  }
}
// Head h's decay gate of one token, in place over the raw projection gr[0, D).
void kda_gate_head(const KdaWeights& w, const graph::KdaGate& gate, int64_t h, int64_t D, float* gr) {
  // exp(A_log) as the binder computed it (a GGUF stores -exp(A_log): model/gguf_model.cpp); weights built
  // without it (tests, dummy weights) compute it here, the same std::exp.
  const float a = w.A_exp.empty() ? std::exp(w.A_log[static_cast<size_t>(h)]) : w.A_exp[static_cast<size_t>(h)];
  const float* bias = w.dt_bias.data() + h * D;
  if (gate.bounded) {
    const __m256 va = _mm256_set1_ps(a), lb = _mm256_set1_ps(gate.lower_bound);
    zip8(gr, bias, gr, D, [&](__m256 x, __m256 bi) { return _mm256_mul_ps(lb, sigmoid8(_mm256_mul_ps(va, _mm256_add_ps(x, bi)))); });
  } else {
    const __m256 na = _mm256_set1_ps(-a);
    zip8(gr, bias, gr, D, [&](__m256 x, __m256 bi) { return _mm256_mul_ps(na, softplus8(_mm256_add_ps(x, bi))); });
  }
}
}  // namespace

void CpuBackend::kda_conv_l2norm(int64_t layer, const KdaWeights& w, const graph::KdaDims& dm, Tensor pq, Tensor pk,
                                 Tensor pv, Tensor q, Tensor k, Tensor v) {
  CpuOpProfile::Scope ps(prof_, "kda_conv_l2norm");
  const int64_t Hk = dm.heads, D = dm.head_dim;
  const int C = static_cast<int>(dm.channels()), W = static_cast<int>(dm.conv);
  for_seqs(nullptr, [&](const graph::StepSeq& s) {
    const size_t tail_bytes = static_cast<size_t>(s.cache->spec().kda_conv_floats) * sizeof(float);
    KdaStateView st = s.cache->kda_state(layer);
    // Rows [from, to) of this sequence; the conv is exact in any split (its tail carries the past).
    auto conv = [&](int64_t from, int64_t to) {
      const int64_t off = (s.offset + from) * C;
      const int n = static_cast<int>(to - from);
      short_conv_silu(n, C, W, pq.f() + off, w.q_conv.data(), st.conv_q, q.f() + off);
      short_conv_silu(n, C, W, pk.f() + off, w.k_conv.data(), st.conv_k, k.f() + off);
      short_conv_silu(n, C, W, pv.f() + off, w.v_conv.data(), st.conv_v, v.f() + off);
    };
    const int64_t off = s.offset * C;
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));
    // Decode (a few tokens, no snapshots): the three convs' channel chunks and each chunk's q / k head norms in
    // ONE parallel pass (three fork-joins and a serial norm before: ~31 us per KDA layer at 16 threads, session
    // 26). A chunk is whole heads, at most kShortConvChunk channels (2 heads of 128 on K3 / Kimi-Linear); a
    // channel's conv does not depend on its chunk and each head's norm is the same code: the same bits.
    int heads_per_chunk = 0;
    for (int h = static_cast<int>(std::min<int64_t>(Hk, kShortConvChunk / std::max<int64_t>(D, 1))); h >= 1; --h)
      if (Hk % h == 0) {
        heads_per_chunk = h;
        break;
      }
    if (s.n <= kShortConvFewTokens && s.n_snapshots == 0 && heads_per_chunk > 0 && D % 8 == 0) {
      const int chunk = heads_per_chunk * static_cast<int>(D), chunks = C / chunk, n = static_cast<int>(s.n);
      const float* xs[3] = {pq.f() + off, pk.f() + off, pv.f() + off};
      const float* ws[3] = {w.q_conv.data(), w.k_conv.data(), w.v_conv.data()};
      float* sts[3] = {st.conv_q, st.conv_k, st.conv_v};
      float* ys[3] = {q.f() + off, k.f() + off, v.f() + off};
      parallel_for(3 * chunks, true, [&](int64_t i) {
        const int j = static_cast<int>(i / chunks), c0 = static_cast<int>(i % chunks) * chunk, c1 = c0 + chunk;
        short_conv_silu_channels(n, C, W, xs[j], ws[j], sts[j], ys[j], c0, c1);
        if (j < 2)
          for (int t = 0; t < n; ++t) l2norm_heads(ys[j] + t * C + c0, heads_per_chunk, D, j == 0 ? q_scale : 1.0f);
      });
      return;
    }
    // Speculative decoding: the tails after the pending rows and after each draft but the last, for a rollback.
    int64_t done = 0;
    for (int64_t j = 0; j < s.n_snapshots; ++j) {
      conv(done, s.snapshot_after + j);
      done = s.snapshot_after + j;
      const KdaStateView snap = s.cache->kda_snapshot(layer, j);
      std::memcpy(snap.conv_q, st.conv_q, tail_bytes);
      std::memcpy(snap.conv_k, st.conv_k, tail_bytes);
      std::memcpy(snap.conv_v, st.conv_v, tail_bytes);
    }
    conv(done, s.n);
    // Heads in parallel at prefill sizes (each head's norm is the same on any thread).
    parallel_for(s.n, s.n * C > 65536, [&](int64_t t) {
      l2norm_heads(q.f() + off + t * C, Hk, D, q_scale);
      l2norm_heads(k.f() + off + t * C, Hk, D, 1.0f);
    });
  });
}

void CpuBackend::kda_gates(const KdaWeights& w, const graph::KdaDims& dm, const graph::KdaGate& gate, Tensor g,
                           Tensor beta) {
  CpuOpProfile::Scope ps(prof_, "kda_gates");
  const int64_t Hk = dm.heads, D = dm.head_dim, C = dm.channels();
  // Tokens in parallel at prefill sizes: Kimi-Linear's unbounded gate is a scalar log1p + exp per value
  // (~1 M per layer at pp512), serial it was ~4% of kl-1b's prefill wall time with 2 threads. Each value is
  // computed the same on any thread.
  parallel_for(g.rows, g.rows * C > 65536, [&](int64_t t) {
    for (int64_t h = 0; h < Hk; ++h) kda_gate_head(w, gate, h, D, g.f() + t * C + h * D);
  });
  sigmoid_inplace(beta.f(), beta.count());
}

void CpuBackend::kda_recurrence(int64_t layer, const graph::KdaDims& dm, Tensor q, Tensor k, Tensor v, Tensor g,
                                Tensor beta, Tensor o) {
  CpuOpProfile::Scope ps(prof_, "kda_recurrence");
  const int Hk = static_cast<int>(dm.heads), D = static_cast<int>(dm.head_dim);
  const int64_t C = dm.channels();
  const int chunk = plan_->kda_chunk > 0 ? plan_->kda_chunk : kDefaultKdaChunk;
  for_seqs(nullptr, [&](const graph::StepSeq& s) {
    void* S = s.cache->kda_state(layer).S;
    const CacheDType dt = s.cache->spec().kda_state_dtype;
    const int64_t off = s.offset * C;
    const int n = static_cast<int>(s.n);
    const float* bt = beta.f() + s.offset * Hk;
    auto run = [&](int64_t from, int64_t to) {
      const int64_t o0 = off + from * C;
      const int m = static_cast<int>(to - from);
      if (s.prefill_form)
        kda_chunked_typed(m, Hk, D, chunk, q.f() + o0, k.f() + o0, v.f() + o0, g.f() + o0, bt + from * Hk, S, dt, o.f() + o0);
      else
        kda_recurrent_typed(m, Hk, D, q.f() + o0, k.f() + o0, v.f() + o0, g.f() + o0, bt + from * Hk, S, dt, o.f() + o0);
    };
    // Speculative decoding: the state after the pending rows and after each draft but the last (the
    // recurrence is exact in any split: decode form token by token, bf16 states rounded per token).
    int64_t done = 0;
    for (int64_t j = 0; j < s.n_snapshots; ++j) {
      run(done, s.snapshot_after + j);
      done = s.snapshot_after + j;
      std::memcpy(s.cache->kda_snapshot(layer, j).S, S, static_cast<size_t>(s.cache->spec().kda_state_bytes()));
    }
    run(done, n);
  });
}

void CpuBackend::kda_output_gate(const KdaWeights& w, const graph::KdaDims& dm, float eps, Tensor o, Tensor gate) {
  CpuOpProfile::Scope ps(prof_, "kda_output_gate");
  cpu::rmsnorm(o.f(), w.o_norm.data(), o.rows * dm.heads, dm.head_dim, eps, o.f());
  cpu::sigmoid_mul(o.f(), gate.f(), o.count());
}

namespace {
std::atomic<uint64_t> g_fused_kda_mix_calls{0};
}  // namespace
uint64_t CpuBackend::fused_kda_mix_calls() { return g_fused_kda_mix_calls.load(std::memory_order_relaxed); }

// Decode (every sequence a few tokens in the token-by-token form, no snapshots): the four ops below per (sequence,
// head) in ONE parallel pass -- that head's q / k / v conv channels and norms, decay gates and beta, recurrence,
// output norm and gate. The separate ops were four fork-joins per KDA layer, two of them serial (gates, output
// gate): ~75 us of a KDA layer at 16 threads against ~10 us of work (session 26's profile). Every piece is the
// per-head code the separate ops run (the conv over any whole-head channel range, the per-head recurrence, the
// per-lane gate and sigmoid functions), so the outputs and the states are the same bits.
void CpuBackend::kda_mix(int64_t layer, const KdaWeights& w, const graph::KdaDims& dm, const graph::KdaGate& gate,
                         float eps, Tensor pq, Tensor pk, Tensor pv, Tensor graw, Tensor braw, Tensor gate_proj, Tensor o) {
  const int64_t Hk = dm.heads, D = dm.head_dim;
  bool fused = D % 8 == 0;
  for (const graph::StepSeq& s : plan_->seqs)
    fused = fused && !s.prefill_form && s.n_snapshots == 0 && s.n <= kShortConvFewTokens;
  if (!fused) return Backend::kda_mix(layer, w, dm, gate, eps, pq, pk, pv, graw, braw, gate_proj, o);
  g_fused_kda_mix_calls.fetch_add(1, std::memory_order_relaxed);
  CpuOpProfile::Scope ps(prof_, "kda_mix decode");
  graph::ScratchScope scope(*this);
  const int64_t C = dm.channels();
  Tensor q = scratch(pq.rows, C, graph::ElemType::F32), k = scratch(pq.rows, C, graph::ElemType::F32),
         v = scratch(pq.rows, C, graph::ElemType::F32);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int Wc = static_cast<int>(dm.conv), Ci = static_cast<int>(C), H = static_cast<int>(Hk), Di = static_cast<int>(D);
  parallel_for(static_cast<int64_t>(plan_->seqs.size()) * Hk, true, [&](int64_t i) {
    const graph::StepSeq& s = plan_->seqs[static_cast<size_t>(i / Hk)];
    const int h = static_cast<int>(i % Hk), n = static_cast<int>(s.n), c0 = h * Di, c1 = c0 + Di;
    const int64_t off = s.offset * C;
    KdaStateView st = s.cache->kda_state(layer);
    short_conv_silu_channels(n, Ci, Wc, pq.f() + off, w.q_conv.data(), st.conv_q, q.f() + off, c0, c1);
    short_conv_silu_channels(n, Ci, Wc, pk.f() + off, w.k_conv.data(), st.conv_k, k.f() + off, c0, c1);
    short_conv_silu_channels(n, Ci, Wc, pv.f() + off, w.v_conv.data(), st.conv_v, v.f() + off, c0, c1);
    for (int t = 0; t < n; ++t) {
      const int64_t row = off + t * C + c0;
      l2norm_heads(q.f() + row, 1, D, q_scale);
      l2norm_heads(k.f() + row, 1, D, 1.0f);
      kda_gate_head(w, gate, h, D, graw.f() + row);
      sigmoid_inplace(braw.f() + (s.offset + t) * Hk + h, 1);
    }
    thread_local std::vector<float> ws;
    ws.resize(static_cast<size_t>(3 * D + D * D));
    kda_recurrent_head_typed(n, H, Di, h, q.f() + off, k.f() + off, v.f() + off, graw.f() + off, braw.f() + s.offset * Hk,
                             st.S, s.cache->spec().kda_state_dtype, o.f() + off, ws.data());
    for (int t = 0; t < n; ++t) {
      float* orow = o.f() + off + t * C + c0;
      cpu::rmsnorm(orow, w.o_norm.data(), 1, D, eps, orow);
      cpu::sigmoid_mul(orow, gate_proj.f() + off + t * C + c0, D);
    }
  });
}

}  // namespace k3::cpu
