// Cache dtypes on the GPU (core/cache_dtype.h, docs/cache-dtypes.md): MLA latent rows written / gathered
// by backend/cuda/mla_cache_rows.h (through MlaPaging, pages of several layers) must be the very bytes /
// values of the CPU's cpu::mla_write_rows / mla_gather_rows (fp8 codes through the SATFINITE cvt, bf16
// rounding, the scale), and the KDA recurrent / fused decode kernels with a bf16 state must equal the
// fp32-state kernels run on the widened state, rounded after every token, bit for bit.
// Run: k3_cuda_tests --gtest_filter='CudaCacheDType*'
#include <gtest/gtest.h>

#include "cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "k3/backend/cpu/mla_cache_rows.h"
#include "k3/backend/cuda/kda_kernels.h"
#include "k3/backend/cuda/mla_cache_rows.h"
#include "k3/core/cache_dtype.h"
#include "mla_paged_cache.h"

namespace {

using k3::CacheDType;
using Vec = std::vector<float>;

using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::have_gpu;

constexpr int kKr = 512, kDr = 64, kDc = kKr + kDr;

// Rows that exercise every rounding decision: c_kv[0] = +-448 makes the fp8 scale exactly 1, so the codes
// are the plain conversion of a dense sweep of [-448, 448] (code midpoints and their neighbours included);
// then random rows of several magnitudes (scales that are not powers of two).
Vec test_latents(int N) {
  Vec lat(static_cast<size_t>(N) * kDc);
  std::vector<float> sweep;
  for (int c = 0; c < 0x7E; ++c) {
    const float a = k3::fp8_e4m3_to_f32(uint8_t(c)), b = k3::fp8_e4m3_to_f32(uint8_t(c + 1));
    const float mid = (a + b) / 2;
    sweep.insert(sweep.end(), {a, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1000.f), -mid, -a});
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  size_t k = 0;
  for (int t = 0; t < N; ++t) {
    float* r = lat.data() + static_cast<size_t>(t) * kDc;
    if (t < N / 2) {
      r[0] = t % 2 ? 448.f : -448.f;
      for (int i = 1; i < kDc; ++i) r[i] = sweep[k++ % sweep.size()];
    } else {
      const float mag = std::ldexp(1.f, t % 9 - 4) * 1.37f;
      for (int i = 0; i < kDc; ++i) r[i] = nd(rng) * mag;
    }
  }
  return lat;
}

// Written rows must be the CPU's bytes, in layer 1 of pages of 3 layers (two sequences, pages of 16 and 5
// tokens stored in reverse order): every other byte of the image keeps its 0xFF poison (no write lands in
// another layer, sequence or page). Then each sequence is gathered back as the CPU gathers the same rows.
TEST(CudaCacheDType, WriteRowsAndGatherMatchCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const int n0 = 70, n1 = 33, N = n0 + n1, layer = 1;
  const Vec lat = test_latents(N);
  for (CacheDType dt : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8_E4M3}) {
    k3_test::MlaPagedCache cache(dt, kKr, kDr, 3, {{n0, 16}, {n1, 5}});
    cache.upload_image();  // all 0xFF
    std::vector<int32_t> tok_seq, tok_pos;
    for (int t = 0; t < N; ++t) {
      tok_seq.push_back(t < n0 ? 0 : 1);
      tok_pos.push_back(t < n0 ? t : t - n0);
    }
    Dev<int32_t> ts(tok_seq), tp(tok_pos);
    Dev<float> dlat(lat);
    const k3::cuda::MlaPaging pg = cache.paging(layer, ts.p, tp.p);
    ck(k3::cuda::mla_write_rows(pg, N, dlat.p, nullptr), "write");
    std::vector<uint8_t> img = cache.download_image();
    const size_t rb = size_t(cache.row_bytes());
    std::vector<uint8_t> want(rb);
    int bad_rows = 0;
    for (int t = 0; t < N; ++t) {
      uint8_t* got = img.data() + cache.row_offset(layer, tok_seq[size_t(t)], tok_pos[size_t(t)]);
      k3::cpu::mla_encode_row(dt, kKr, kDr, lat.data() + size_t(t) * kDc, want.data());
      if (std::memcmp(got, want.data(), rb) != 0 && ++bad_rows < 4) {
        size_t i = 0;
        while (got[i] == want[i]) ++i;
        ADD_FAILURE() << k3::cache_dtype_name(dt) << " row " << t << " first differing byte " << i << ": gpu "
                      << int(got[i]) << " cpu " << int(want[i]);
      }
      std::memcpy(cache.host().data() + (got - img.data()), got, rb);  // the rows the CPU gathers below
      std::memset(got, 0xFF, rb);
    }
    EXPECT_EQ(bad_rows, 0) << k3::cache_dtype_name(dt);
    EXPECT_EQ(std::count(img.begin(), img.end(), uint8_t{0xFF}), std::ptrdiff_t(img.size()))
        << k3::cache_dtype_name(dt) << ": bytes outside the written rows changed";
    // Gather each sequence back; the CPU decodes the same rows.
    for (int seq = 0; seq < 2; ++seq) {
      const int S = seq == 0 ? n0 : n1;
      Dev<float> out(static_cast<size_t>(S) * kDc);
      ck(k3::cuda::mla_gather_latents(pg, seq, S, out.p, nullptr), "gather");
      const std::vector<const void*> rows = cache.host_rows(layer, seq);
      Vec ref(static_cast<size_t>(S) * kDc);
      k3::cpu::mla_gather_rows(dt, S, kKr, kDr, rows.data(), ref.data());
      const Vec got = out.get();
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << k3::cache_dtype_name(dt) << " seq " << seq;
    }
  }
}

TEST(CudaCacheDType, RejectsBadShapes) {
  SKIP_WITHOUT_GPU();
  k3::cuda::MlaPaging pg{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 510, 64, CacheDType::FP8_E4M3};
  EXPECT_EQ(k3::cuda::mla_write_rows(pg, 1, nullptr, nullptr), cudaErrorInvalidValue);  // kr % 4
  pg.kr = 512;
  EXPECT_EQ(k3::cuda::mla_gather_latents(pg, 0, -1, nullptr, nullptr), cudaErrorInvalidValue);
  pg.layer = -1;
  EXPECT_EQ(k3::cuda::mla_write_rows(pg, 1, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::kda_recurrent_typed(nullptr, 1, 1, 128, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                          CacheDType::FP8_E4M3, nullptr),
            cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------------------
// KDA with a bf16 state.

struct Rng {
  std::mt19937 g;
  explicit Rng(uint32_t s) : g(s) {}
  Vec normals(size_t n, float sd = 1.f) {
    std::normal_distribution<float> nd(0.f, sd);
    Vec v(n);
    for (auto& x : v) x = nd(g);
    return v;
  }
  Vec uni(size_t n, float a, float b) {
    std::uniform_real_distribution<float> u(a, b);
    Vec v(n);
    for (auto& x : v) x = u(g);
    return v;
  }
};

std::vector<uint16_t> to_bf16(const Vec& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = k3::f32_to_bf16(x[i]);
  return b;
}
Vec widen(const std::vector<uint16_t>& b) {
  Vec x(b.size());
  for (size_t i = 0; i < b.size(); ++i) x[i] = k3::bf16_to_f32(b[i]);
  return x;
}

void normalise_rows(Vec& x, int D, float extra) {
  for (size_t r = 0; r < x.size() / size_t(D); ++r) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += double(x[r * D + d]) * x[r * D + d];
    for (int d = 0; d < D; ++d) x[r * D + d] *= float(extra / std::sqrt(s + 1e-6));
  }
}

// The token-by-token kernel with a bf16 state rounds after every token: the reference runs the fp32 kernel
// one token at a time and rounds the state to bf16 in between.
TEST(CudaCacheDTypeKda, Bf16RecurrentEqualsFp32KernelRoundedAfterEveryToken) {
  SKIP_WITHOUT_GPU();
  for (int D : {64, 128}) {
    const int H = 3, C = H * D, lens[2] = {7, 1}, N = 8;
    Rng r(40 + D);
    Vec q = r.normals(size_t(N) * C), k = r.normals(size_t(N) * C);
    normalise_rows(q, D, 1.f / std::sqrt(float(D)));
    normalise_rows(k, D, 1.f);
    const Vec v = r.normals(size_t(N) * C), g = r.uni(size_t(N) * C, -2.f, -0.01f), beta = r.uni(size_t(N) * H, 0.1f, 0.9f);
    const size_t SS = size_t(H) * D * D;
    const std::vector<uint16_t> s0 = to_bf16(r.normals(2 * SS, 0.3f));
    Dev<float> dq(q), dk(k), dv(v), dg(g), db(beta), o32(size_t(N) * C), o16(size_t(N) * C);
    Dev<float> S32(widen(s0));
    Dev<uint16_t> S16(s0);
    auto table = [&](float* S, size_t elem_bytes) {
      std::vector<k3::cuda::KdaSeq> t(2);
      for (int i = 0; i < 2; ++i)
        t[size_t(i)] = k3::cuda::KdaSeq{reinterpret_cast<float*>(reinterpret_cast<char*>(S) + i * SS * elem_bytes),
                                        nullptr, nullptr, nullptr, i == 0 ? 0 : lens[0], lens[i]};
      return t;
    };
    Dev<k3::cuda::KdaSeq> seq16(table(reinterpret_cast<float*>(S16.p), 2));
    for (int t = 0; t < lens[0]; ++t) {
      std::vector<k3::cuda::KdaSeq> one;
      for (int i = 0; i < 2; ++i)
        if (t < lens[i])
          one.push_back(k3::cuda::KdaSeq{S32.p + i * SS, nullptr, nullptr, nullptr, (i == 0 ? 0 : lens[0]) + t, 1});
      Dev<k3::cuda::KdaSeq> seq32(one);
      ck(k3::cuda::kda_recurrent(seq32.p, static_cast<int>(one.size()), H, D, dq.p, dk.p, dv.p, dg.p, db.p, o32.p, nullptr),
         "fp32");
      const Vec rounded = widen(to_bf16(S32.get()));
      ck(cudaMemcpy(S32.p, rounded.data(), rounded.size() * 4, cudaMemcpyHostToDevice), "H2D");
    }
    ck(k3::cuda::kda_recurrent_typed(seq16.p, 2, H, D, dq.p, dk.p, dv.p, dg.p, db.p, o16.p, CacheDType::BF16, nullptr),
       "bf16");
    const Vec a = o32.get(), b = o16.get();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "D " << D;
    EXPECT_EQ(S16.get(), to_bf16(S32.get())) << "D " << D;
    EXPECT_NE(S16.get(), s0);  // the state moved
  }
}

TEST(CudaCacheDTypeKda, Bf16FusedDecodeEqualsFp32KernelOnWidenedStateRoundedOnce) {
  SKIP_WITHOUT_GPU();
  for (int D : {64, 128}) {
    const int H = 2, C = H * D, B = 3, W = 4, P = W - 1;
    Rng r(80 + D);
    const size_t SS = size_t(H) * D * D, SC = size_t(C) * P;
    const Vec xq = r.normals(size_t(B) * C), xk = r.normals(size_t(B) * C), xv = r.normals(size_t(B) * C);
    const Vec wq = r.normals(size_t(C) * W, 0.5f), wk = r.normals(size_t(C) * W, 0.5f), wv = r.normals(size_t(C) * W, 0.5f);
    const Vec graw = r.normals(size_t(B) * C), dt_bias = r.normals(C), A_log = r.uni(H, -1.f, 1.f);
    const Vec braw = r.normals(size_t(B) * H), gate = r.normals(size_t(B) * C), nw = r.uni(D, 0.5f, 1.5f);
    const Vec conv0 = r.normals(B * SC);
    const std::vector<uint16_t> s0 = to_bf16(r.normals(B * SS, 0.3f));
    Dev<float> dxq(xq), dxk(xk), dxv(xv), dwq(wq), dwk(wk), dwv(wv), dg(graw), ddt(dt_bias), dA(A_log), dbr(braw),
        dgate(gate), dnw(nw), o32(size_t(B) * C), o16(size_t(B) * C);
    Dev<float> S32(widen(s0)), c32q(conv0), c32k(conv0), c32v(conv0), c16q(conv0), c16k(conv0), c16v(conv0);
    Dev<uint16_t> S16(s0);
    auto table = [&](char* S, size_t elem_bytes, Dev<float>& cq, Dev<float>& ck_, Dev<float>& cv) {
      std::vector<k3::cuda::KdaSeq> t(B);
      for (int i = 0; i < B; ++i)
        t[size_t(i)] = k3::cuda::KdaSeq{reinterpret_cast<float*>(S + i * SS * elem_bytes), cq.p + i * SC,
                                        ck_.p + i * SC, cv.p + i * SC, i, 1};
      return t;
    };
    Dev<k3::cuda::KdaSeq> seq32(table(reinterpret_cast<char*>(S32.p), 4, c32q, c32k, c32v)),
        seq16(table(reinterpret_cast<char*>(S16.p), 2, c16q, c16k, c16v));
    ck(k3::cuda::kda_decode_fused(seq32.p, B, H, D, W, dxq.p, dxk.p, dxv.p, dwq.p, dwk.p, dwv.p, dg.p, ddt.p, dA.p,
                                  false, -5.f, dbr.p, dgate.p, dnw.p, 1e-5f, o32.p, nullptr),
       "fp32");
    ck(k3::cuda::kda_decode_fused_typed(seq16.p, B, H, D, W, dxq.p, dxk.p, dxv.p, dwq.p, dwk.p, dwv.p, dg.p, ddt.p,
                                        dA.p, false, -5.f, dbr.p, dgate.p, dnw.p, 1e-5f, o16.p, CacheDType::BF16,
                                        nullptr),
       "bf16");
    const Vec a = o32.get(), b = o16.get();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "D " << D;
    EXPECT_EQ(S16.get(), to_bf16(S32.get())) << "D " << D;
    EXPECT_EQ(c16q.get(), c32q.get());
    EXPECT_NE(S16.get(), s0);
  }
}

}  // namespace
