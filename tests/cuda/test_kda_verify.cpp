// kda_verify_fused (backend/cuda/kda_kernels.h) against its definition: n decode steps of
// kda_decode_fused_typed, one token at a time, per sequence. The outputs of every row, the final state and
// conv tails, and every snapshot must be the same BITS (memcmp), for fp32 and bf16 states, every supported
// head dim, several heads, sequences of different lengths with snapshots at different positions (none, one,
// every position as in a real verification of k drafts: after 1 .. k of the k + 1 rows) in one launch. Random, never-zero inputs; every
// output buffer starts poisoned (0xff), so a row or a snapshot the kernel forgets to write fails.
#include <gtest/gtest.h>

#include "cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "k3/backend/cuda/kda_kernels.h"

namespace {

using k3::CacheDType;
using k3::cuda::KdaFusedIn;
using k3::cuda::KdaSeq;
using k3::cuda::KdaSnapSeq;
using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::have_gpu;
using k3cudatest::randn;
using Vec = std::vector<float>;
using Bytes = std::vector<uint8_t>;

uint16_t to_bf16(float x) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// One sequence's device state: the recurrent state (dtype bytes) and the three conv tails.
struct State {
  Dev<uint8_t> S;
  Dev<float> conv[3];
  State(const Bytes& s, const Vec (&c)[3]) : S(s), conv{Dev<float>(c[0]), Dev<float>(c[1]), Dev<float>(c[2])} {}
  explicit State(size_t s_bytes, size_t conv_floats) : S(s_bytes), conv{Dev<float>(conv_floats), Dev<float>(conv_floats), Dev<float>(conv_floats)} {
    S.poison();
    for (auto& c : conv) c.poison();
  }
  KdaSeq view(int offset, int n) { return KdaSeq{reinterpret_cast<float*>(S.p), conv[0].p, conv[1].p, conv[2].p, offset, n}; }
  // The state's bytes then the tails' bytes, for one memcmp.
  Bytes bytes() const {
    Bytes b = S.get();
    for (const auto& c : conv) {
      const Vec v = c.get();
      const auto* p = reinterpret_cast<const uint8_t*>(v.data());
      b.insert(b.end(), p, p + v.size() * sizeof(float));
    }
    return b;
  }
};

struct SeqCase {
  int n, after, n_snap;
};

TEST(CudaKdaVerify, FusedVerificationEqualsDecodeStepsBitForBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<SeqCase> cases = {{5, 1, 4}, {1, 1, 0}, {3, 2, 1}, {4, 1, 3}, {6, 3, 2}};
  uint64_t seed = 900;
  for (const CacheDType dt : {CacheDType::F32, CacheDType::BF16})
    for (const int D : {32, 64, 128})
      for (const int H : {1, 3})
        for (const int W : {4, 2}) {
          const int P = W - 1, C = H * D, B = static_cast<int>(cases.size());
          int N = 0;
          std::vector<int> offset;
          for (const SeqCase& c : cases) offset.push_back(N), N += c.n;
          const size_t SS = static_cast<size_t>(H) * D * D, s_bytes = SS * (dt == CacheDType::BF16 ? 2 : 4),
                       SC = static_cast<size_t>(C) * P;
          // Inputs and weights.
          Vec x[3], w[3];
          for (int m = 0; m < 3; ++m) {
            x[m] = randn(static_cast<size_t>(N) * C, ++seed);
            w[m] = randn(static_cast<size_t>(C) * W, ++seed, 0.5f);
          }
          const Vec graw = randn(static_cast<size_t>(N) * C, ++seed, 2.f), braw = randn(static_cast<size_t>(N) * H, ++seed, 2.f),
                    gate = randn(static_cast<size_t>(N) * C, ++seed, 2.f), dt_bias = randn(C, ++seed),
                    A_log = randn(H, ++seed, 0.5f);
          Vec norm_w = randn(D, ++seed, 0.2f);
          for (auto& v : norm_w) v += 1.f;
          Dev<float> dx0(x[0]), dx1(x[1]), dx2(x[2]), dw0(w[0]), dw1(w[1]), dw2(w[2]), dgr(graw), dbr(braw), dgate(gate),
              ddt(dt_bias), dA(A_log), dnw(norm_w);
          const KdaFusedIn in{dx0.p, dx1.p, dx2.p, dw0.p, dw1.p, dw2.p, dgr.p, ddt.p, dA.p, true, -5.f, dbr.p, dgate.p, dnw.p, 1e-5f};
          // Initial states per sequence (the same bytes for both paths).
          std::vector<Bytes> S0(B);
          std::vector<std::array<Vec, 3>> conv0(B);
          for (int i = 0; i < B; ++i) {
            const Vec s = randn(SS, ++seed, 0.3f);
            S0[i].resize(s_bytes);
            if (dt == CacheDType::BF16) {
              for (size_t j = 0; j < SS; ++j) {
                const uint16_t h = to_bf16(s[j]);
                std::memcpy(S0[i].data() + 2 * j, &h, 2);
              }
            } else {
              std::memcpy(S0[i].data(), s.data(), s_bytes);
            }
            for (int m = 0; m < 3; ++m) conv0[i][m] = randn(SC, ++seed);
          }
          auto make = [&](int i) {
            const Vec c[3] = {conv0[i][0], conv0[i][1], conv0[i][2]};
            return std::make_unique<State>(S0[i], c);
          };
          // Reference: decode steps, one sequence and one token per launch; snapshots copied out.
          Dev<float> o_ref(static_cast<size_t>(N) * C), o_ver(static_cast<size_t>(N) * C);
          o_ref.poison();
          o_ver.poison();
          std::vector<Bytes> final_ref(B), snap_ref;
          for (int i = 0; i < B; ++i) {
            auto st = make(i);
            for (int t = 0; t < cases[i].n; ++t) {
              Dev<KdaSeq> one(std::vector<KdaSeq>{st->view(offset[i] + t, 1)});
              ck(k3::cuda::kda_decode_fused_typed(one.p, 1, H, D, W, in.xq, in.xk, in.xv, in.wq, in.wk, in.wv, in.graw,
                                                  in.dt_bias, in.A_log, in.bounded, in.lower_bound, in.braw, in.gate,
                                                  in.norm_w, in.eps, o_ref.p, dt, nullptr),
                 "decode step");
              const int j = t + 1 - cases[i].after;
              if (j >= 0 && j < cases[i].n_snap) snap_ref.push_back(st->bytes());
            }
            final_ref[i] = st->bytes();
          }
          // One verification launch over every sequence, snapshots into poisoned views.
          std::vector<std::unique_ptr<State>> live, snaps;
          std::vector<KdaSnapSeq> table;
          std::vector<KdaSeq> views;
          for (int i = 0; i < B; ++i) {
            live.push_back(make(i));
            table.push_back({live.back()->view(offset[i], cases[i].n), cases[i].after, cases[i].n_snap,
                             static_cast<int32_t>(views.size())});
            for (int j = 0; j < cases[i].n_snap; ++j) {
              snaps.push_back(std::make_unique<State>(s_bytes, SC));
              views.push_back(snaps.back()->view(0, 0));
            }
          }
          Dev<KdaSnapSeq> dtable(table);
          Dev<KdaSeq> dviews(views);
          ck(k3::cuda::kda_verify_fused(dtable.p, B, dviews.p, H, D, W, in, o_ver.p, dt, nullptr), "verify");
          ck(cudaDeviceSynchronize(), "sync");

          const Vec a = o_ref.get(), b = o_ver.get();
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
              << "outputs differ: D " << D << " H " << H << " W " << W << " bf16 " << (dt == CacheDType::BF16);
          bool finite = true;
          for (float v : b) finite = finite && std::isfinite(v);
          EXPECT_TRUE(finite);
          for (int i = 0; i < B; ++i) EXPECT_EQ(live[static_cast<size_t>(i)]->bytes(), final_ref[i]) << "final state of sequence " << i;
          ASSERT_EQ(snaps.size(), snap_ref.size());
          for (size_t j = 0; j < snaps.size(); ++j) EXPECT_EQ(snaps[j]->bytes(), snap_ref[j]) << "snapshot " << j;
          std::printf("[ kda ] verify fused == %d decode steps: D=%3d H=%d W=%d state %s, %zu snapshots\n", N, D, H, W,
                      dt == CacheDType::BF16 ? "bf16" : "f32", snaps.size());
        }
}

TEST(CudaKdaVerify, RejectsBadShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const KdaFusedIn in{};
  EXPECT_EQ(k3::cuda::kda_verify_fused(nullptr, 1, nullptr, 1, 128, 4, in, nullptr, CacheDType::F32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::kda_verify_fused(nullptr, 0, nullptr, 1, 48, 4, in, nullptr, CacheDType::F32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::kda_verify_fused(nullptr, 0, nullptr, 1, 128, 5, in, nullptr, CacheDType::F32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::kda_verify_fused(nullptr, 0, nullptr, 1, 128, 4, in, nullptr, CacheDType::FP8_E4M3, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::kda_verify_fused(nullptr, 0, nullptr, 1, 128, 4, in, nullptr, CacheDType::F32, nullptr), cudaSuccess);
}

}  // namespace
