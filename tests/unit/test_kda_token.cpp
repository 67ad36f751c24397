// The KDA decode step's kernels (backend/cpu/kda_token.h) and the one-token width-4 conv (kda.cpp) give the bits of
// the loops they replaced: the recurrent state and the outputs are compared bitwise, not within a tolerance, since the
// CPU's decode paths are checked bit for bit against each other (kda_mix vs the separate ops, batch invariance).
//   - each kernel that runs here against the old loops written out below, one fma per element and row as the
//     compiler fused them (and the library's Reference kernel, those loops as they were, against the same);
//   - kda_recurrent_head_typed with each kernel forced against the Reference kernel, fp32 and bf16 states, D 64 / 128,
//     1..3 tokens in one call;
//   - the one-token conv (T = 1, W = 4: transposes in registers) against the few-token form's gathers (T = 3 in one
//     call), channel ranges with and without a remainder of < 8 channels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/kda_token.h"
#include "k3/core/dtype.h"

namespace {

using Vec = std::vector<float>;
using k3::cpu::KdaTokenKernel;

constexpr KdaTokenKernel kKernels[] = {KdaTokenKernel::Reference, KdaTokenKernel::Avx2, KdaTokenKernel::Avx512};
const char* name(KdaTokenKernel k) {
  return k == KdaTokenKernel::Reference ? "reference" : k == KdaTokenKernel::Avx2 ? "avx2" : "avx512";
}

Vec random_vec(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  Vec v(n);
  for (float& x : v) x = u(rng);
  return v;
}

bool same_bits(const Vec& a, const Vec& b) { return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0; }

// kda_recurrent_head's per-token loops before the kernels (kda_token.h), with the fma the compiler fused
// `y += a * x` into written out: S' = dg S (a rounded product), u = S'^T k and o = S^T q one fma per row.
void old_token_step(int D, const float* q, const float* k, const float* v, const float* dg, float beta, float* S, float* o) {
  Vec u(static_cast<size_t>(D), 0.f);
  for (int dk = 0; dk < D; ++dk)
    for (int j = 0; j < D; ++j) {
      float& s = S[static_cast<size_t>(dk) * D + j];
      s = s * dg[dk];
      u[static_cast<size_t>(j)] = std::fma(k[dk], s, u[static_cast<size_t>(j)]);
    }
  for (int j = 0; j < D; ++j) u[static_cast<size_t>(j)] = beta * (v[j] - u[static_cast<size_t>(j)]);
  for (int j = 0; j < D; ++j) o[j] = 0.f;
  for (int dk = 0; dk < D; ++dk)
    for (int j = 0; j < D; ++j) {
      float& s = S[static_cast<size_t>(dk) * D + j];
      s = std::fma(k[dk], u[static_cast<size_t>(j)], s);
      o[j] = std::fma(q[dk], s, o[j]);
    }
}

TEST(KdaToken, KernelsHaveTheOldLoopsBits) {
  std::mt19937 rng(11);
  int ran = 0;
  // 128: one AVX-512 block of whole rows, two AVX2 blocks; 48, 144, 200: remainder blocks of either
  for (int D : {16, 48, 64, 128, 144, 200}) {
    const Vec S0 = random_vec(static_cast<size_t>(D) * D, rng, -0.5f, 0.5f);
    for (KdaTokenKernel kern : kKernels) {
      if (!k3::cpu::kda_token_kernel_runs(kern, D)) continue;
      ++ran;
      Vec S = S0, Sref = S0, o(static_cast<size_t>(D)), oref(static_cast<size_t>(D)), scratch(static_cast<size_t>(D));
      std::mt19937 tok(static_cast<unsigned>(D));
      for (int t = 0; t < 3; ++t) {  // three tokens in a row on the same state
        const Vec q = random_vec(D, tok, -0.3f, 0.3f), k = random_vec(D, tok, -0.3f, 0.3f), v = random_vec(D, tok, -1.f, 1.f),
                  dg = random_vec(D, tok, 0.5f, 1.f);
        const float beta = std::uniform_real_distribution<float>(0.1f, 0.9f)(tok);
        k3::cpu::kda_token_step(kern, D, q.data(), k.data(), v.data(), dg.data(), beta, S.data(), o.data(), scratch.data());
        old_token_step(D, q.data(), k.data(), v.data(), dg.data(), beta, Sref.data(), oref.data());
        EXPECT_TRUE(same_bits(S, Sref)) << name(kern) << " D=" << D << " token " << t << ": state";
        EXPECT_TRUE(same_bits(o, oref)) << name(kern) << " D=" << D << " token " << t << ": output";
      }
      ASSERT_NE(S, S0);  // the state moved
    }
  }
  EXPECT_GE(ran, 12);  // Reference and Avx2 at every D, at least
}

// One head's full decode call (exp of the gates, the steps, bf16 rounding per token) with `kern` forced.
void run_head(KdaTokenKernel kern, int T, int H, int D, int h, const Vec& q, const Vec& k, const Vec& v, const Vec& g,
              const Vec& beta, std::vector<uint8_t>& state, k3::CacheDType dt, Vec& out) {
  k3::cpu::force_kda_token_kernel_for_testing(kern);
  Vec scratch(3 * static_cast<size_t>(D) + static_cast<size_t>(D) * D);
  k3::cpu::kda_recurrent_head_typed(T, H, D, h, q.data(), k.data(), v.data(), g.data(), beta.data(), state.data(), dt,
                                    out.data(), scratch.data());
  k3::cpu::force_kda_token_kernel_for_testing(std::nullopt);
}

TEST(KdaToken, RecurrentHeadTypedSameBitsWithEveryKernel) {
  constexpr int H = 2;
  std::mt19937 rng(12);
  for (k3::CacheDType dt : {k3::CacheDType::F32, k3::CacheDType::BF16})
    for (int D : {64, 128})
      for (int T : {1, 2, 3}) {
        const size_t n = static_cast<size_t>(T) * H * D;
        const Vec q = random_vec(n, rng, -0.1f, 0.1f), k = random_vec(n, rng, -0.2f, 0.2f), v = random_vec(n, rng, -1.f, 1.f),
                  g = random_vec(n, rng, -0.5f, 0.f), beta = random_vec(static_cast<size_t>(T) * H, rng, 0.1f, 0.9f);
        const Vec s = random_vec(static_cast<size_t>(H) * D * D, rng, -0.5f, 0.5f);
        std::vector<uint8_t> S0(s.size() * (dt == k3::CacheDType::F32 ? 4 : 2));
        for (size_t i = 0; i < s.size(); ++i) {
          if (dt == k3::CacheDType::F32)
            std::memcpy(S0.data() + 4 * i, &s[i], 4);
          else
            reinterpret_cast<uint16_t*>(S0.data())[i] = k3::f32_to_bf16(s[i]);
        }
        for (int h = 0; h < H; ++h) {
          std::vector<uint8_t> Sref = S0;
          Vec oref(n, -7.f);
          run_head(KdaTokenKernel::Reference, T, H, D, h, q, k, v, g, beta, Sref, dt, oref);
          ASSERT_NE(Sref, S0);
          for (KdaTokenKernel kern : {KdaTokenKernel::Avx2, KdaTokenKernel::Avx512}) {
            if (!k3::cpu::kda_token_kernel_runs(kern, D)) continue;
            std::vector<uint8_t> S1 = S0;
            Vec o(n, -7.f);
            run_head(kern, T, H, D, h, q, k, v, g, beta, S1, dt, o);
            EXPECT_EQ(S1, Sref) << name(kern) << " " << k3::cache_dtype_name(dt) << " D=" << D << " T=" << T << " h=" << h;
            EXPECT_TRUE(same_bits(o, oref)) << name(kern) << " " << k3::cache_dtype_name(dt) << " D=" << D << " T=" << T;
          }
        }
      }
}

// The vector kernels round a bf16 state in registers; the Reference kernel with the scalar f32_to_bf16. Rows with
// k = 0 and dg = 1.5 store dg S exactly rounded: a bf16 value times 1.5 has one bit past bf16's, so half of them are
// ties (to even, both ways); the max bf16 overflows there (rounds to inf), denormals stay denormal. Then an inf
// (inf - inf: NaN) and a NaN with a payload in the state.
TEST(KdaToken, Bf16RoundingHasTheScalarBits) {
  constexpr int D = 64;
  std::mt19937 rng(14);
  for (int scene = 0; scene < 3; ++scene) {
    std::vector<uint16_t> S0(static_cast<size_t>(D) * D);
    for (uint16_t& x : S0) x = k3::f32_to_bf16(std::uniform_real_distribution<float>(-0.5f, 0.5f)(rng));
    Vec q = random_vec(D, rng, -0.3f, 0.3f), k = random_vec(D, rng, -0.3f, 0.3f), v = random_vec(D, rng, -1.f, 1.f),
        dg = random_vec(D, rng, 0.5f, 1.f);
    for (int dk = 0; dk < 4; ++dk) k[static_cast<size_t>(dk)] = 0.f, dg[static_cast<size_t>(dk)] = 1.5f;
    S0[5] = 0x7f7f, S0[6] = 0xff7f, S0[7] = 0x0001, S0[D + 9] = 0x8003;  // +-max, denormals (rows 0, 1)
    if (scene == 1) S0[10 * D + 3] = 0x7f80;                              // +inf (row 10: k != 0)
    if (scene == 2) S0[12 * D + 4] = 0x7fc1;                              // a quiet NaN with a payload
    std::vector<uint16_t> Sref = S0;
    Vec oref(D), scratch(D), wide(static_cast<size_t>(D) * D);
    k3::cpu::kda_token_step_bf16(KdaTokenKernel::Reference, D, q.data(), k.data(), v.data(), dg.data(), 0.7f, Sref.data(),
                                 oref.data(), scratch.data(), wide.data());
    for (KdaTokenKernel kern : {KdaTokenKernel::Avx2, KdaTokenKernel::Avx512}) {
      if (!k3::cpu::kda_token_kernel_runs(kern, D)) continue;
      std::vector<uint16_t> S = S0;
      Vec o(D);
      k3::cpu::kda_token_step_bf16(kern, D, q.data(), k.data(), v.data(), dg.data(), 0.7f, S.data(), o.data(), scratch.data(),
                                   wide.data());
      EXPECT_EQ(S, Sref) << name(kern) << " scene " << scene;
      EXPECT_TRUE(same_bits(o, oref)) << name(kern) << " scene " << scene;
    }
  }
}

TEST(KdaToken, OneTokenConvHasTheGathersBits) {
  constexpr int W = 4, P = W - 1, T = 3;
  std::mt19937 rng(13);
  for (int C : {8, 20, 256, 300}) {
    const Vec x = random_vec(static_cast<size_t>(T) * C, rng, -3.f, 3.f), w = random_vec(static_cast<size_t>(C) * W, rng, -0.7f, 0.7f),
              st0 = random_vec(static_cast<size_t>(C) * P, rng, -3.f, 3.f);
    // the few-token form with gathers: three tokens in one call
    Vec st_ref = st0, y_ref(x.size());
    k3::cpu::short_conv_silu_channels(T, C, W, x.data(), w.data(), st_ref.data(), y_ref.data(), 0, C);
    // one token at a time, whole range and as two ranges (the second starting at channel 8)
    Vec st1 = st0, y1(x.size()), st2 = st0, y2(x.size());
    for (int t = 0; t < T; ++t) {
      const size_t o = static_cast<size_t>(t) * C;
      k3::cpu::short_conv_silu_channels(1, C, W, x.data() + o, w.data(), st1.data(), y1.data() + o, 0, C);
      k3::cpu::short_conv_silu_channels(1, C, W, x.data() + o, w.data(), st2.data(), y2.data() + o, 0, 8);
      k3::cpu::short_conv_silu_channels(1, C, W, x.data() + o, w.data(), st2.data(), y2.data() + o, 8, C);
    }
    EXPECT_TRUE(same_bits(y1, y_ref)) << "C=" << C;
    EXPECT_TRUE(same_bits(st1, st_ref)) << "C=" << C;
    EXPECT_TRUE(same_bits(y2, y_ref)) << "C=" << C << " split";
    EXPECT_TRUE(same_bits(st2, st_ref)) << "C=" << C << " split";
  }
}

}  // namespace
