// KDA kernels vs independent float64 references (model-spec 3.2).
#include <gtest/gtest.h>

#include "kda_test_inputs.h"

#include "kernel_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "k3/backend/cpu/kda.h"

namespace {

using Vec = std::vector<float>;

enum class Gate { K3, KimiLinear, Strong };

using k3test::KdaInputs;
using k3test::l2norm_rows;
using k3test::sigmoid;
using k3test::softplus;

KdaInputs make_inputs(int T, int H, int D, Gate gate, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  KdaInputs in{T, H, D, {}, {}, {}, {}, {}, {}};
  const std::size_t n = std::size_t(T) * H * D;
  in.q.resize(n);
  in.k.resize(n);
  in.v.resize(n);
  in.g.resize(n);
  in.beta.resize(std::size_t(T) * H);
  in.state.resize(std::size_t(H) * D * D);
  for (auto& x : in.q) x = nd(rng);
  for (auto& x : in.k) x = nd(rng);
  for (auto& x : in.v) x = nd(rng);
  l2norm_rows(in.q, D, 1.f / std::sqrt(float(D)));
  l2norm_rows(in.k, D, 1.f);
  std::vector<float> a_head(H);
  for (auto& a : a_head) a = 0.5f * nd(rng);
  for (std::size_t i = 0; i < n; ++i) {
    const int h = int((i / D) % H);
    switch (gate) {
      case Gate::K3: in.g[i] = -5.f * sigmoid(2.f * nd(rng)); break;
      case Gate::KimiLinear: in.g[i] = -std::exp(a_head[h]) * softplus(nd(rng)); break;
      // very fast decay on some channels: cumulative decay over a chunk reaches thousands
      case Gate::Strong: in.g[i] = -std::exp(3.f) * softplus(2.f * nd(rng) + 1.f); break;
    }
  }
  for (auto& b : in.beta) b = sigmoid(nd(rng));
  for (auto& s : in.state) s = 0.3f * nd(rng);
  return in;
}

// Straightforward float64 recurrence.
void kda_ref(const KdaInputs& in, std::vector<double>& out, std::vector<double>& state) {
  const int T = in.T, H = in.H, D = in.D;
  state.assign(in.state.begin(), in.state.end());
  out.assign(std::size_t(T) * H * D, 0.0);
  std::vector<double> u(D);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const std::size_t off = (std::size_t(t) * H + h) * D;
      double* S = state.data() + std::size_t(h) * D * D;
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) S[i * D + j] *= std::exp(double(in.g[off + i]));
      for (int j = 0; j < D; ++j) {
        double s = 0;
        for (int i = 0; i < D; ++i) s += S[i * D + j] * in.k[off + i];
        u[j] = s;
      }
      const double b = in.beta[std::size_t(t) * H + h];
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) S[i * D + j] += b * in.k[off + i] * (in.v[off + j] - u[j]);
      for (int j = 0; j < D; ++j) {
        double s = 0;
        for (int i = 0; i < D; ++i) s += S[i * D + j] * in.q[off + i];
        out[off + j] = s;
      }
    }
}

using k3test::rel_err;
using k3test::Worst;

const int kDs[] = {16, 32, 128};
const int kHs[] = {1, 3};
const int kTs[] = {1, 5, 63, 64, 65, 130, 200};
const Gate kGates[] = {Gate::K3, Gate::KimiLinear};

}  // namespace

TEST(Kda, RecurrentMatchesF64Reference) {
  Worst wo("recurrent out vs f64"), ws("recurrent state vs f64");
  unsigned seed = 1;
  for (int D : kDs)
    for (int H : kHs)
      for (int T : kTs)
        for (Gate gate : kGates) {
          auto in = make_inputs(T, H, D, gate, seed++);
          std::vector<double> ro, rs;
          kda_ref(in, ro, rs);
          Vec st = in.state, out(in.q.size());
          k3::cpu::kda_recurrent(T, H, D, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                 st.data(), out.data());
          const double eo = rel_err(out, ro), es = rel_err(st, rs);
          wo.add(eo);
          ws.add(es);
          EXPECT_LT(eo, 1e-5) << "D=" << D << " H=" << H << " T=" << T << " gate=" << int(gate);
          EXPECT_LT(es, 1e-5) << "D=" << D << " H=" << H << " T=" << T << " gate=" << int(gate);
        }
}

TEST(Kda, ChunkedMatchesRecurrent) {
  Worst wo("chunked out vs recurrent"), ws("chunked state vs recurrent");
  unsigned seed = 1000;
  for (int D : kDs)
    for (int H : kHs)
      for (int T : kTs)
        for (Gate gate : kGates)
          for (int C : {16, 64}) {
            auto in = make_inputs(T, H, D, gate, seed++);
            Vec s1 = in.state, o1(in.q.size()), s2 = in.state, o2(in.q.size());
            k3::cpu::kda_recurrent(T, H, D, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                   s1.data(), o1.data());
            k3::cpu::kda_chunked(T, H, D, C, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                 s2.data(), o2.data());
            const double eo = rel_err(o2, o1), es = rel_err(s2, s1);
            wo.add(eo);
            ws.add(es);
            EXPECT_LT(eo, 1e-4) << "D=" << D << " H=" << H << " T=" << T << " C=" << C << " gate=" << int(gate);
            EXPECT_LT(es, 1e-4) << "D=" << D << " H=" << H << " T=" << T << " C=" << C << " gate=" << int(gate);
          }
}

TEST(Kda, ChunkedOddChunkSizesAndStrongDecay) {
  Worst w("chunked odd C / strong decay vs f64");
  unsigned seed = 5000;
  for (Gate gate : {Gate::K3, Gate::KimiLinear, Gate::Strong})
    for (int C : {1, 3, 7, 64, 200, 1000}) {
      auto in = make_inputs(77, 2, 32, gate, seed++);
      std::vector<double> ro, rs;
      kda_ref(in, ro, rs);
      Vec st = in.state, out(in.q.size());
      k3::cpu::kda_chunked(77, 2, 32, C, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                           st.data(), out.data());
      const double eo = rel_err(out, ro), es = rel_err(st, rs);
      w.add(std::max(eo, es));
      EXPECT_LT(eo, 1e-4) << "C=" << C << " gate=" << int(gate);
      EXPECT_LT(es, 1e-4) << "C=" << C << " gate=" << int(gate);
    }
}

TEST(Kda, ChunkedSplitCallsEqualOneCall) {
  Worst w("chunked split vs one call");
  unsigned seed = 7000;
  for (int D : {16, 128})
    for (int C : {16, 64}) {
      const int T = 200, H = 3;
      auto in = make_inputs(T, H, D, Gate::KimiLinear, seed++);
      Vec s_all = in.state, o_all(in.q.size());
      k3::cpu::kda_chunked(T, H, D, C, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                           s_all.data(), o_all.data());
      for (int T1 : {1, 17, 64, 65, 130, 199}) {
        Vec st = in.state, out(in.q.size());
        const std::size_t o1 = std::size_t(T1) * H * D, b1 = std::size_t(T1) * H;
        k3::cpu::kda_chunked(T1, H, D, C, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                             st.data(), out.data());
        k3::cpu::kda_chunked(T - T1, H, D, C, in.q.data() + o1, in.k.data() + o1, in.v.data() + o1,
                             in.g.data() + o1, in.beta.data() + b1, st.data(), out.data() + o1);
        const double eo = rel_err(out, o_all), es = rel_err(st, s_all);
        w.add(std::max(eo, es));
        EXPECT_LT(eo, 1e-4) << "D=" << D << " C=" << C << " T1=" << T1;
        EXPECT_LT(es, 1e-4) << "D=" << D << " C=" << C << " T1=" << T1;
      }
      // decode continuation: recurrent after a chunked prefill equals one chunked call
      Vec st = in.state, out(in.q.size());
      const int T1 = 150;
      const std::size_t o1 = std::size_t(T1) * H * D, b1 = std::size_t(T1) * H;
      k3::cpu::kda_chunked(T1, H, D, C, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                           st.data(), out.data());
      for (int t = T1; t < T; ++t) {
        const std::size_t o = std::size_t(t) * H * D, b = std::size_t(t) * H;
        k3::cpu::kda_recurrent(1, H, D, in.q.data() + o, in.k.data() + o, in.v.data() + o, in.g.data() + o,
                               in.beta.data() + b, st.data(), out.data() + o);
      }
      (void)o1;
      (void)b1;
      EXPECT_LT(rel_err(out, o_all), 1e-4);
      EXPECT_LT(rel_err(st, s_all), 1e-4);
    }
}

// The chunked form factors the decay through each 16-row sub-block's first row when every gate of the chunk
// is <= 0 (kda.cpp, cross_block_scores); a chunk with a positive gate takes the exp per (i, j, channel)
// everywhere. Both against float64, in the same call (chunks with and without a positive gate).
TEST(Kda, ChunkedPositiveGateChunksMatchF64) {
  auto in = make_inputs(150, 2, 32, Gate::KimiLinear, 4242);
  for (std::size_t i = 0; i < std::size_t(64) * 2 * 32; i += 97) in.g[i] = 0.05f;  // the first chunk of 64 only
  std::vector<double> ro, rs;
  kda_ref(in, ro, rs);
  Vec st = in.state, out(in.q.size());
  k3::cpu::kda_chunked(150, 2, 32, 64, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), st.data(),
                       out.data());
  EXPECT_LT(rel_err(out, ro), 1e-4);
  EXPECT_LT(rel_err(st, rs), 1e-4);
}

TEST(Kda, ComparisonDetectsDifferentInputs) {
  // The checks above must be able to fail: a small change of the gates or of one beta is visible.
  auto in = make_inputs(65, 1, 32, Gate::K3, 42);
  Vec s1 = in.state, o1(in.q.size());
  k3::cpu::kda_chunked(65, 1, 32, 16, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), s1.data(),
                       o1.data());
  auto in2 = in;
  for (auto& x : in2.g) x *= 1.01f;
  Vec s2 = in.state, o2(in.q.size());
  k3::cpu::kda_recurrent(65, 1, 32, in2.q.data(), in2.k.data(), in2.v.data(), in2.g.data(), in2.beta.data(),
                         s2.data(), o2.data());
  EXPECT_GT(rel_err(o2, o1), 1e-3);
  auto in3 = in;
  in3.beta[60] = 0.5f * in3.beta[60];
  Vec s3 = in.state, o3(in.q.size());
  k3::cpu::kda_chunked(65, 1, 32, 16, in3.q.data(), in3.k.data(), in3.v.data(), in3.g.data(), in3.beta.data(),
                       s3.data(), o3.data());
  EXPECT_GT(rel_err(s3, s1), 1e-3);
  EXPECT_GT(rel_err(o3, o1), 1e-3);
}

namespace {

// PyTorch Conv1d(groups=C, padding=W-1) on [state, x], first T outputs after the state, then SiLU.
void conv_ref(int T, int C, int W, const Vec& x, const Vec& w, const Vec& st0, std::vector<double>& y,
              Vec& st1) {
  const int P = W - 1;
  y.assign(std::size_t(T) * C, 0.0);
  st1.assign(std::size_t(C) * P, 0.f);
  for (int c = 0; c < C; ++c) {
    std::vector<double> seq;
    for (int j = 0; j < P; ++j) seq.push_back(st0[std::size_t(c) * P + j]);
    for (int t = 0; t < T; ++t) seq.push_back(x[std::size_t(t) * C + c]);
    for (int t = 0; t < T; ++t) {
      double a = 0;
      for (int j = 0; j < W; ++j) a += double(w[std::size_t(c) * W + j]) * seq[t + j];  // seq[t+P] = x_t
      y[std::size_t(t) * C + c] = a / (1.0 + std::exp(-a));
    }
    for (int j = 0; j < P; ++j) st1[std::size_t(c) * P + j] = float(seq[seq.size() - P + j]);
  }
}

}  // namespace

// The CPU backend's decode pass runs the few-token conv per chunk of whole heads (short_conv_silu_channels, several
// convs' chunks in one parallel pass): chunk by chunk, in any order, it must give short_conv_silu's outputs and
// state bitwise, for chunk widths that do and do not line up with its own 256-channel chunks.
TEST(KdaConv, ChannelChunksEqualTheWholeConv) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int T = 1; T <= k3::cpu::kShortConvFewTokens; ++T)
    for (int chunk : {32, 96, 256, 512}) {
      const int C = 1536, W = 4, P = W - 1;
      Vec x(std::size_t(T) * C), wt(std::size_t(C) * W), st(std::size_t(C) * P);
      for (auto& a : x) a = 2.f * nd(rng);
      for (auto& a : wt) a = 0.5f * nd(rng);
      for (auto& a : st) a = 2.f * nd(rng);
      Vec s1 = st, y1(x.size(), -7.f);
      k3::cpu::short_conv_silu(T, C, W, x.data(), wt.data(), s1.data(), y1.data());
      Vec s2 = st, y2(x.size(), -9.f);
      for (int c0 = C - chunk; c0 >= 0; c0 -= chunk)  // last chunk first: no order dependence
        k3::cpu::short_conv_silu_channels(T, C, W, x.data(), wt.data(), s2.data(), y2.data(), c0, c0 + chunk);
      EXPECT_EQ(y2, y1) << "T=" << T << " chunk=" << chunk;
      EXPECT_EQ(s2, s1) << "T=" << T << " chunk=" << chunk;
      EXPECT_NE(s1, st);  // the state moved
    }
}

TEST(KdaConv, ShortConvSiluMatchesReferenceAndStreams) {
  Worst w("short conv vs f64");
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int W : {1, 2, 4})
    for (int T : {1, 2, 3, 5, 64})
      for (int C : {7, 384}) {
        Vec x(std::size_t(T) * C), wt(std::size_t(C) * W), st(std::size_t(C) * std::max(W - 1, 0));
        for (auto& a : x) a = 2.f * nd(rng);
        for (auto& a : wt) a = 0.5f * nd(rng);
        for (auto& a : st) a = 2.f * nd(rng);
        std::vector<double> yr;
        Vec sr;
        conv_ref(T, C, W, x, wt, st, yr, sr);
        Vec s1 = st, y1(x.size());
        k3::cpu::short_conv_silu(T, C, W, x.data(), wt.data(), s1.data(), y1.data());
        const double e = rel_err(y1, yr);
        w.add(e);
        EXPECT_LT(e, 1e-6) << "W=" << W << " T=" << T << " C=" << C;
        EXPECT_EQ(s1, sr) << "W=" << W << " T=" << T;
        // streaming one token at a time
        Vec s2 = st, y2(x.size());
        for (int t = 0; t < T; ++t)
          k3::cpu::short_conv_silu(1, C, W, x.data() + std::size_t(t) * C, wt.data(), s2.data(),
                                   y2.data() + std::size_t(t) * C);
        EXPECT_EQ(y2, y1) << "W=" << W << " T=" << T;
        EXPECT_EQ(s2, sr);
        // uneven split 2 + rest
        if (T > 2) {
          Vec s3 = st, y3(x.size());
          k3::cpu::short_conv_silu(2, C, W, x.data(), wt.data(), s3.data(), y3.data());
          k3::cpu::short_conv_silu(T - 2, C, W, x.data() + 2 * C, wt.data(), s3.data(), y3.data() + 2 * C);
          EXPECT_EQ(y3, y1);
          EXPECT_EQ(s3, sr);
        }
      }
  // taps are ordered oldest -> current: swapping taps changes the result
  Vec x(4 * 3, 1.f), wt = {1, 0, 0, 0, 1, 0, 0, 0, 1}, st(3 * 2, 0.f), y(12);
  for (int i = 0; i < 12; ++i) x[i] = float(i + 1);
  k3::cpu::short_conv_silu(4, 3, 3, x.data(), wt.data(), st.data(), y.data());
  // channel 2 has weight only on the current tap: y = silu(x)
  EXPECT_NEAR(y[3 * 3 + 2], 12.f / (1.f + std::exp(-12.f)), 1e-5f);
  // channel 0 has weight only on the oldest tap: y_t = silu(x_{t-2}), zero state for t < 2
  EXPECT_NEAR(y[0 * 3 + 0], 0.f, 1e-7f);
  EXPECT_NEAR(y[3 * 3 + 0], 4.f / (1.f + std::exp(-4.f)), 1e-5f);
}
