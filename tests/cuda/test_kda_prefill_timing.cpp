// Where a KDA layer's prefill time goes, piece by piece, as CudaBackend::kda_mix runs it (Backend::kda_mix: the
// conv + L2 norm, the gates, the chunked recurrence, the gated output norm), at the Kimi-Linear (32 heads) and K3
// (96 heads) widths: the fp32 chunked kernels (the bf16x2 default), kda_chunked_tc on fp32 inputs (the bf16 GEMM
// mode today) and on bf16 inputs (what the fused kernel needs), and its any-decay form (Kimi-Linear's unbounded gate). Prints only (a timing, not a check: the kernels'
// correctness is CudaKda.* and CudaKdaTc.*); the outputs are checked finite so a failed launch cannot pass quietly.
#include <gtest/gtest.h>

#include "cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "k3/backend/cuda/kda_chunked_tc.h"
#include "k3/backend/cuda/kda_kernels.h"

namespace {

using k3::cuda::KdaInType;
using k3::cuda::KdaSeq;
using k3cudatest::ck;
using k3cudatest::bf16_bits;
using k3cudatest::Dev;
using Vec = std::vector<float>;

// Milliseconds a call of fn (returning a cudaError_t) after one warm-up, the mean of reps.
template <class F>
float ms_per_call(F&& fn, int reps) {
  return static_cast<float>(k3cudatest::event_us(1, reps, [&](int) { ck(fn(), "launch"); }) / 1000.0);
}

void time_shape(int ns, int T, int H) {
  const auto fill = k3cudatest::lcg_fill;
  constexpr int D = 128, W = 4, P = W - 1;
  const int C = H * D, N = ns * T;
  const size_t NC = static_cast<size_t>(N) * C, SS = static_cast<size_t>(H) * D * D, SC = static_cast<size_t>(C) * P;
  // Projections as the model hands them over; the chunk kernels' inputs shaped as conv_l2norm / gates leave them.
  Dev<float> xq(fill(NC, -1.f, 1.f, 1)), xk(fill(NC, -1.f, 1.f, 2)), xv(fill(NC, -1.f, 1.f, 3));
  Dev<float> wq(fill(static_cast<size_t>(C) * W, -0.5f, 0.5f, 4)), wk(fill(static_cast<size_t>(C) * W, -0.5f, 0.5f, 5)),
      wv(fill(static_cast<size_t>(C) * W, -0.5f, 0.5f, 6));
  const Vec hq = fill(NC, -0.09f, 0.09f, 7), hk = fill(NC, -0.15f, 0.15f, 8), hv = fill(NC, -1.f, 1.f, 9),
            hg = fill(NC, -5.f, -0.001f, 10);
  Dev<float> q(hq), k(hk), v(hv), g(hg), graw(fill(NC, -2.f, 2.f, 11)), beta(fill(static_cast<size_t>(N) * H, 0.1f, 0.9f, 12));
  Dev<float> braw(fill(static_cast<size_t>(N) * H, -2.f, 2.f, 13)), dt(fill(C, -1.f, 1.f, 14)), A_log(fill(H, -1.f, 1.f, 15));
  Dev<float> gate(fill(NC, -2.f, 2.f, 16)), nw(fill(D, 0.5f, 1.5f, 17)), o(NC), qo(NC), ko(NC), vo(NC);
  Dev<uint16_t> q16(bf16_bits(hq)), k16(bf16_bits(hk)), v16(bf16_bits(hv)), g16(bf16_bits(hg));
  Dev<float> S(fill(ns * SS, -0.1f, 0.1f, 18)), cq(fill(ns * SC, -1.f, 1.f, 19)), ckv(fill(ns * SC, -1.f, 1.f, 20)),
      cv(fill(ns * SC, -1.f, 1.f, 21));
  std::vector<KdaSeq> t(ns);
  for (int i = 0; i < ns; ++i) t[i] = KdaSeq{S.p + i * SS, cq.p + i * SC, ckv.p + i * SC, cv.p + i * SC, i * T, T};
  Dev<KdaSeq> seqs(t);
  const size_t wsf = k3::cuda::kda_chunked_workspace_bytes(N, ns, H, D, 32);
  const size_t wst = k3::cuda::kda_chunked_tc_workspace_bytes(N, ns, H, D, 32);
  Dev<char> ws(std::max(wsf, wst));
  const int reps = 5;

  const float conv = ms_per_call([&] {
    return k3::cuda::kda_conv_l2norm(seqs.p, ns, N, H, D, W, xq.p, xk.p, xv.p, wq.p, wk.p, wv.p, qo.p, ko.p, vo.p, nullptr);
  }, reps);
  const float conv16 = ms_per_call([&] {
    return k3::cuda::kda_conv_l2norm_bf16(seqs.p, ns, N, H, D, W, xq.p, xk.p, xv.p, wq.p, wk.p, wv.p, q16.p, k16.p,
                                          v16.p, nullptr);
  }, reps);
  // The gates run in place: on a copy each time would time the copy, so they run on graw again and again (the
  // arithmetic per element is the same whatever the values).
  const float gates = ms_per_call([&] {
    return k3::cuda::kda_gates(N, H, D, graw.p, dt.p, A_log.p, true, -5.f, braw.p, nullptr);
  }, reps);
  Dev<uint16_t> gcopy(NC);
  const float gates16 = ms_per_call([&] {
    return k3::cuda::kda_gates(N, H, D, graw.p, dt.p, A_log.p, true, -5.f, braw.p, nullptr, gcopy.p);
  }, reps);
  const float f32 = ms_per_call([&] {
    return k3::cuda::kda_chunked(seqs.p, ns, N, H, D, 32, q.p, k.p, v.p, g.p, beta.p, o.p, ws.p, wsf, nullptr);
  }, reps);
  const float tc32 = ms_per_call([&] {
    return k3::cuda::kda_chunked_tc(seqs.p, ns, N, H, D, 32, KdaInType::F32, q.p, k.p, v.p, g.p, beta.p, o.p, nullptr,
                                    k3::cuda::KdaTcTuning{}, ws.p, wst, nullptr);
  }, reps);
  const float tc16 = ms_per_call([&] {
    return k3::cuda::kda_chunked_tc(seqs.p, ns, N, H, D, 32, KdaInType::BF16, q16.p, k16.p, v16.p, g16.p, beta.p, o.p,
                                    nullptr, k3::cuda::KdaTcTuning{}, ws.p, wst, nullptr);
  }, reps);
  // KdaDecays::Any (an unbounded gate: the exact diagonal blocks; data-independent work, so in-range decays time it)
  const float any32 = ms_per_call([&] {
    return k3::cuda::kda_chunked_tc(seqs.p, ns, N, H, D, 32, KdaInType::F32, q.p, k.p, v.p, g.p, beta.p, o.p, nullptr,
                                    k3::cuda::KdaTcTuning{}, ws.p, wst, nullptr, k3::cuda::KdaDecays::Any);
  }, reps);
  const float any16 = ms_per_call([&] {
    return k3::cuda::kda_chunked_tc(seqs.p, ns, N, H, D, 32, KdaInType::BF16, q16.p, k16.p, v16.p, g16.p, beta.p, o.p,
                                    nullptr, k3::cuda::KdaTcTuning{}, ws.p, wst, nullptr, k3::cuda::KdaDecays::Any);
  }, reps);
  const float outg = ms_per_call([&] {
    return k3::cuda::kda_output_gate(N, H, D, o.p, nw.p, 1e-5f, gate.p, nullptr);
  }, reps);
  const Vec out = o.get();
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
  std::printf("[ timing ] kda prefill %d x %5d tokens, H=%2d: conv+l2 %.3f (bf16 out %.3f) | gates %.3f (+bf16 copy %.3f)"
              " | chunked32 f32 %.3f | tc f32-in %.3f | tc bf16-in %.3f | out gate %.3f ms; layer f32 %.3f, tc f32-in %.3f,"
              " bf16 planes %.3f ms; any-decay tc f32-in %.3f, bf16-in %.3f ms (layer on bf16 planes %.3f)\n",
              ns, T, H, conv, conv16, gates, gates16, f32, tc32, tc16, outg, conv + gates + f32 + outg,
              conv + gates + tc32 + outg, conv16 + gates16 + tc16 + outg, any32, any16, conv16 + gates16 + any16 + outg);
}

TEST(CudaKdaPrefill, TimingPieces) {
  SKIP_WITHOUT_GPU();
  time_shape(1, 4096, 32);
  time_shape(8, 512, 32);
  time_shape(1, 4096, 96);
  time_shape(1, 8192, 96);
}

}  // namespace
