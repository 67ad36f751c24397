// Absorbed MLA decode attention (mla_attend_latent): the tensor-core kernels (wgmma, sm90a/mla_decode_wgmma.cu,
// for BF16 rows; mma.sync, mla_decode_tc.cu; bf16 operands, fp32 softmax / accumulators) and the fp32 SIMT kernel
// against cpu::mla_attention_latent_rows_typed
// over the very stored bytes, for every cache dtype (F32, BF16, FP8_E4M3), on random paged caches in
// MlaPaging's layout (mla_paged_cache.h: pages of 3 MLA layers, the tested layer 1 between poisoned
// ones, a page size per sequence): a batch of sequences of mixed lengths (1 .. 9000 keys, tile multiples
// and not), pages stored in reverse order, two tokens of one sequence, a tok_index subset in a scrambled
// order, with and without the split-key workspace. Error = max |gpu - cpu| / max |cpu| over the selected
// tokens; rows the subset leaves out must keep their poison.
// Tolerances (fp32 rows measured on the H200, docs/perf/cuda.md session 6, in brackets): tensor cores
// (bf16 q, rows and P: ~2^-9 relative per operand) 1e-2 with a flat softmax (q * 0.2: <= 3.2e-3) and
// 2.5e-2 with a peaked one (q * 2.0, logits std ~3.5: <= 1.2e-2; a score error d moves p by a factor e^d,
// and the peaked case has scores ~10x larger); the fp32 SIMT path 1e-5 flat (<= 1.9e-7) and 1e-4 peaked
// (<= 2.8e-5). The same bars hold for BF16 / FP8 rows: the reference reads the same stored values, so only
// the kernels' own rounding differs (FP8 on tensor cores: code * scale rounded to bf16 once).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/mla_decode_tc.h"
#include "k3/backend/cuda/mla_decode_wgmma.h"
#include "k3/backend/cuda/mla_kernels.h"
#include "mla_paged_cache.h"

namespace {

using k3::cuda::DeviceBuffer;
constexpr int kKr = 512, kDr = 64, kCd = 576;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

using k3::CacheDType;
using k3_test::MlaPagedCache;
using Seq = k3_test::MlaSeqShape;
constexpr int kLayers = 3, kLayer = 1;  // the tested layer sits between two poisoned ones

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  return k3_test::mla_upload(v);
}

const char* dtype_name(CacheDType dt) { return k3::cache_dtype_name(dt); }

// The batch tokens over a paged cache (layer kLayer filled), their queries and CPU reference outputs.
struct Batch {
  int nh = 0, N = 0;
  std::vector<float> q, ref;
  std::vector<int32_t> tseq, tpos, index;
  DeviceBuffer dts, dtp, didx, dq;
  k3::cuda::MlaPaging pg{};
};

// Tokens: one per sequence at its last position, plus one more of sequence 0 one position earlier.
void make_batch(Batch& b, const MlaPagedCache& cache, int nh, const std::vector<Seq>& seqs, bool subset, float qscale,
                uint64_t seed) {
  b.nh = nh;
  for (size_t s = 0; s < seqs.size(); ++s) {
    b.tseq.push_back(static_cast<int32_t>(s));
    b.tpos.push_back(seqs[s].len - 1);
  }
  if (seqs[0].len >= 2) {
    b.tseq.push_back(0);
    b.tpos.push_back(seqs[0].len - 2);
  }
  b.N = static_cast<int>(b.tseq.size());
  b.q = randn(static_cast<size_t>(b.N) * nh * kCd, seed + 1, qscale);
  b.ref.assign(static_cast<size_t>(b.N) * nh * kKr, 0.f);
  const float scale = 1.0f / std::sqrt(192.0f);
  for (int t = 0; t < b.N; ++t) {
    const std::vector<const void*> rows = cache.host_rows(kLayer, b.tseq[static_cast<size_t>(t)]);
    k3::cpu::mla_attention_latent_rows_typed(1, b.tpos[static_cast<size_t>(t)], nh, kKr, kDr,
                                             b.q.data() + static_cast<size_t>(t) * nh * kCd, rows.data(), cache.dtype(),
                                             scale, b.ref.data() + static_cast<size_t>(t) * nh * kKr);
  }
  if (subset) {  // every other token, last first; token 1 left out
    for (int t = b.N - 1; t >= 0; --t)
      if (t != 1 && (t % 2 == 0 || t == b.N - 1)) b.index.push_back(t);
  }
  b.dts = upload(b.tseq);
  b.dtp = upload(b.tpos);
  b.didx = upload(b.index);
  b.dq = upload(b.q);
  b.pg = cache.paging(kLayer, b.dts.get<int32_t>(), b.dtp.get<int32_t>(), b.index.empty() ? nullptr : b.didx.get<int32_t>());
}

// Runs `attend` over the batch into a NaN-poisoned output; returns the error over the selected tokens,
// or infinity when a selected value is not finite or an unselected row was written.
template <class F>
double check_run(const Batch& b, F attend) {
  const int n_sel = b.index.empty() ? b.N : static_cast<int>(b.index.size());
  const size_t out_floats = static_cast<size_t>(b.N) * b.nh * kKr;
  DeviceBuffer out(out_floats * 4);
  K3_CUDA_CHECK(cudaMemset(out.get(), 0xff, out_floats * 4));
  K3_CUDA_CHECK(attend(n_sel, out.get<float>()));
  K3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(out_floats);
  K3_CUDA_CHECK(cudaMemcpy(got.data(), out.get(), out_floats * 4, cudaMemcpyDeviceToHost));
  std::vector<char> selected(static_cast<size_t>(b.N), b.index.empty() ? 1 : 0);
  for (int t : b.index) selected[static_cast<size_t>(t)] = 1;
  double md = 0, mr = 0;
  for (int t = 0; t < b.N; ++t)
    for (size_t i = 0; i < static_cast<size_t>(b.nh) * kKr; ++i) {
      const size_t k = static_cast<size_t>(t) * b.nh * kKr + i;
      if (!selected[static_cast<size_t>(t)]) {
        uint32_t bits;
        std::memcpy(&bits, &got[k], 4);
        if (bits != 0xffffffffu) return INFINITY;
        continue;
      }
      if (!std::isfinite(got[k])) return INFINITY;
      md = std::max(md, std::fabs(static_cast<double>(got[k]) - b.ref[k]));
      mr = std::max(mr, std::fabs(static_cast<double>(b.ref[k])));
    }
  return md / std::max(mr, 1e-30);
}

// Forces the SIMT path of mla_attend_latent for the scope (K3_MLA_DECODE is read per call).
struct ForceSimt {
  ForceSimt() { setenv("K3_MLA_DECODE", "simt", 1); }
  ~ForceSimt() { unsetenv("K3_MLA_DECODE"); }
};

TEST(CudaMlaDecode, TensorCoreAndSimtMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Seq> seqs = {{9000, 16}, {1, 16}, {33, 64}, {4100, 256}, {32, 5}, {129, 1}, {1000, 64}, {31, 16}, {2, 7}};
  const float scale = 1.0f / std::sqrt(192.0f);
  uint64_t seed = 100;
  for (const CacheDType dt : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8_E4M3}) {
    MlaPagedCache cache(dt, kKr, kDr, kLayers, seqs);
    cache.fill_layer_random(kLayer, seed += 13);
    const std::vector<int> heads = dt == CacheDType::F32 ? std::vector<int>{8, 16, 32, 96} : std::vector<int>{8, 96};
    for (const int nh : heads)
      for (const bool subset : {false, true})
        for (const float qscale : {0.2f, 2.0f}) {  // flat and peaked softmax
          Batch b;
          make_batch(b, cache, nh, seqs, subset, qscale, seed += 7);
          const int n_sel = b.index.empty() ? b.N : static_cast<int>(b.index.size());
          DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(n_sel, nh, kKr)) * 4);
          auto tc = [&](float* ws_or_null) {
            return [&, ws_or_null](int n, float* out) {
              return k3::cuda::mla_tc::attend(b.pg, n, nh, b.dq.get<float>(), scale, out, ws_or_null, nullptr);
            };
          };
          const double e_tc = check_run(b, tc(ws.get<float>())), e_tc1 = check_run(b, tc(nullptr));
          double e_simt = 0;
          {
            ForceSimt force;
            e_simt = check_run(b, [&](int n, float* out) {
              return k3::cuda::mla_attend_latent(b.pg, n, nh, b.dq.get<float>(), scale, out, ws.get<float>(), nullptr);
            });
          }
          // The default path: tensor cores from 16 heads.
          const bool uses_tc = k3::cuda::mla_attend_uses_tensor_cores(nh, kKr, kDr);
          EXPECT_EQ(uses_tc, nh >= 16);
          const double e_default = check_run(b, [&](int n, float* out) {
            return k3::cuda::mla_attend_latent(b.pg, n, nh, b.dq.get<float>(), scale, out, ws.get<float>(), nullptr);
          });
          std::printf("[ mla ] decode %-8s nh=%2d tokens %d%s q*%.1f: tensor cores rel %.2e (split x%d) / %.2e (no split); "
                      "simt %.2e; default (%s) %.2e\n",
                      dtype_name(dt), nh, n_sel, subset ? " (tok_index subset)" : "", qscale, e_tc,
                      k3::cuda::mla_tc::splits(n_sel, nh, dt), e_tc1, e_simt, uses_tc ? "tc" : "simt", e_default);
          const bool peaked = qscale > 1.f;
          const double tol_tc = peaked ? 2.5e-2 : 1e-2, tol_simt = peaked ? 1e-4 : 1e-5;
          EXPECT_LT(e_tc, tol_tc) << dtype_name(dt);
          EXPECT_LT(e_tc1, tol_tc) << dtype_name(dt);
          EXPECT_LT(e_simt, tol_simt) << dtype_name(dt);
          EXPECT_LT(e_default, uses_tc ? tol_tc : tol_simt) << dtype_name(dt);
        }
  }
}

// The wgmma kernel (BF16 rows, blocks of 64 heads) against the CPU: head counts that fill a block, leave
// part of one empty (16, 32, 96) or need two (96, 128); flat and peaked softmax; the whole batch and a
// scrambled tok_index subset; split-key workspace or none. The same bars as the mma.sync kernel (same
// operand rounding: bf16 q, rows as stored, bf16 P).
TEST(CudaMlaDecode, WgmmaMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Seq> seqs = {{9000, 16}, {1, 16}, {33, 64}, {4100, 256}, {64, 5}, {129, 1}, {1000, 64}, {65, 16}, {2, 7}};
  const float scale = 1.0f / std::sqrt(192.0f);
  MlaPagedCache cache(CacheDType::BF16, kKr, kDr, kLayers, seqs);
  cache.fill_layer_random(kLayer, 4242);
  ASSERT_TRUE(k3::cuda::mla_wg::supports(kKr, kDr, CacheDType::BF16));
  EXPECT_FALSE(k3::cuda::mla_wg::supports(kKr, kDr, CacheDType::F32));
  EXPECT_FALSE(k3::cuda::mla_wg::supports(kKr, kDr, CacheDType::FP8_E4M3));
  uint64_t seed = 900;
  for (const int nh : {16, 32, 64, 96, 128})
    for (const float qscale : {0.2f, 2.0f}) {
      Batch b;
      make_batch(b, cache, nh, seqs, /*subset=*/true, qscale, seed += 11);
      DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(b.N, nh, kKr)) * 4);
      auto wg = [&](float* ws_or_null) {
        return [&, ws_or_null](int n, float* out) {
          return k3::cuda::mla_wg::attend(b.pg, n, nh, b.dq.get<float>(), scale, out, ws_or_null, nullptr);
        };
      };
      const double e_sub = check_run(b, wg(ws.get<float>()));
      // The whole batch (the same reference): no tok_index.
      const std::vector<int32_t> index = std::move(b.index);
      b.index.clear();
      b.pg.tok_index = nullptr;
      const double e_all = check_run(b, wg(ws.get<float>())), e_all1 = check_run(b, wg(nullptr));
      std::printf("[ mla ] decode wgmma bfloat16 nh=%3d q*%.1f: rel %.2e (tok_index subset of %zu) / %.2e (all %d, split x%d) "
                  "/ %.2e (no split)\n",
                  nh, qscale, e_sub, index.size(), e_all, b.N, k3::cuda::mla_wg::splits(b.N, nh), e_all1);
      const double tol = qscale > 1.f ? 2.5e-2 : 1e-2;
      EXPECT_LT(e_sub, tol) << "nh " << nh;
      EXPECT_LT(e_all, tol) << "nh " << nh;
      EXPECT_LT(e_all1, tol) << "nh " << nh;
    }
  // The default path takes it for BF16 rows where the measured rule says so (>= 32 heads), never for other dtypes.
  using k3::cuda::MlaDecodeKernel;
  EXPECT_EQ(k3::cuda::mla_attend_kernel(64, 96, kKr, kDr, CacheDType::BF16), MlaDecodeKernel::Wgmma);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(1, 96, kKr, kDr, CacheDType::BF16), MlaDecodeKernel::Wgmma);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(1, 32, kKr, kDr, CacheDType::BF16), MlaDecodeKernel::Wgmma);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(8, 32, kKr, kDr, CacheDType::BF16), MlaDecodeKernel::Wgmma);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(8, 16, kKr, kDr, CacheDType::BF16), MlaDecodeKernel::MmaSync);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(1, 96, kKr, kDr, CacheDType::F32), MlaDecodeKernel::MmaSync);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(64, 96, kKr, kDr, CacheDType::F32), MlaDecodeKernel::MmaSync);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(64, 96, kKr, kDr, CacheDType::FP8_E4M3), MlaDecodeKernel::MmaSync);
  EXPECT_EQ(k3::cuda::mla_attend_kernel(64, 8, kKr, kDr, CacheDType::BF16), MlaDecodeKernel::Simt);
}

// The wgmma kernel over many short sequences (1..200 keys: most in one tile, few or no splits).
TEST(CudaMlaDecode, WgmmaLargeBatchShortContexts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Seq> seqs;
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) seqs.push_back({1 + static_cast<int>(rng() % 200), (16 << (i % 3)) + (i % 2)});
  seqs[1] = {64, 16};
  seqs[2] = {1, 16};
  const float scale = 1.0f / std::sqrt(192.0f);
  MlaPagedCache cache(CacheDType::BF16, kKr, kDr, kLayers, seqs);
  cache.fill_layer_random(kLayer, 71);
  Batch b;
  make_batch(b, cache, 96, seqs, false, 1.0f, 78);
  DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(b.N, 96, kKr)) * 4);
  const double e = check_run(b, [&](int n, float* out) {
    return k3::cuda::mla_wg::attend(b.pg, n, 96, b.dq.get<float>(), scale, out, ws.get<float>(), nullptr);
  });
  std::printf("[ mla ] decode wgmma bfloat16 nh=96 tokens %d (contexts 1..200): rel %.2e (split x%d)\n", b.N, e,
              k3::cuda::mla_wg::splits(b.N, 96));
  EXPECT_LT(e, 1e-2);
}

// The tensor-core path must also be right at batch sizes where the split rule picks few or no splits,
// and for a context of exactly one tile and one row, for every dtype.
TEST(CudaMlaDecode, TensorCoreLargeBatchShortContexts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Seq> seqs;
  std::mt19937 rng(3);
  for (int i = 0; i < 300; ++i) seqs.push_back({1 + static_cast<int>(rng() % 200), (16 << (i % 3)) + (i % 2)});
  seqs[1] = {32, 16};
  seqs[2] = {1, 16};
  const float scale = 1.0f / std::sqrt(192.0f);
  for (const CacheDType dt : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8_E4M3}) {
    MlaPagedCache cache(dt, kKr, kDr, kLayers, seqs);
    cache.fill_layer_random(kLayer, 70);
    Batch b;
    make_batch(b, cache, 32, seqs, false, 1.0f, 77);
    DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(b.N, 32, kKr)) * 4);
    const double e = check_run(b, [&](int n, float* out) {
      return k3::cuda::mla_tc::attend(b.pg, n, 32, b.dq.get<float>(), scale, out, ws.get<float>(), nullptr);
    });
    std::printf("[ mla ] decode %-8s nh=32 tokens %d (contexts 1..200): tensor cores rel %.2e (split x%d)\n",
                dtype_name(dt), b.N, e, k3::cuda::mla_tc::splits(b.N, 32, dt));
    EXPECT_LT(e, 1e-2) << dtype_name(dt);
  }
}

// Bad shapes are refused before any launch.
TEST(CudaMlaDecode, RejectsBadShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  k3::cuda::MlaPaging pg{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 510, 64, CacheDType::BF16};
  EXPECT_EQ(k3::cuda::mla_attend_latent(pg, 1, 8, nullptr, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  pg.kr = 1024;  // more than the SIMT kernel's 512
  EXPECT_EQ(k3::cuda::mla_attend_latent(pg, 1, 8, nullptr, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  pg.kr = 512;
  pg.layer = -1;
  EXPECT_EQ(k3::cuda::mla_attend_latent(pg, 1, 8, nullptr, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  pg.layer = 0;
  pg.dtype = static_cast<CacheDType>(7);
  EXPECT_EQ(k3::cuda::mla_attend_latent(pg, 1, 32, nullptr, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::mla_attend_latent(pg, 0, 32, nullptr, 1.f, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

// Kernel time of the paths (SIMT where it is short, mma.sync, wgmma for BF16) at batch 1/8/64/256 x context
// 1k/8k/32k (and 128k at batch 1 and 8), nh 32 and 96, per cache dtype (prints only). Bytes = the latent rows each sequence reads once (row_bytes per key: 2304 / 1152 / 644);
// enough page-table copies rotate that each call reads its rows from HBM, not L2. Pages of one layer.
// K3_MLA_TIMING_ONLY="nh,L,B" times one shape (for a profiler run), K3_MLA_TIMING_DTYPE=float32|bfloat16|
// fp8_e4m3 one dtype.
TEST(CudaMlaDecodeTiming, TensorCoresVsSimt) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int page = 64;
  int only[3] = {0, 0, 0};
  if (const char* e = std::getenv("K3_MLA_TIMING_ONLY")) std::sscanf(e, "%d,%d,%d", &only[0], &only[1], &only[2]);
  const char* only_dt = std::getenv("K3_MLA_TIMING_DTYPE");
  for (const CacheDType dt : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8_E4M3})
  for (const int nh : {32, 96})
    for (const int L : {1024, 8192, 32768, 131072})
      for (const int B : {1, 8, 64, 256}) {
        if (L > 32768 && B > 8) continue;  // 128k: batch 1 and 8
        if (only_dt && std::strcmp(only_dt, dtype_name(dt)) != 0) continue;
        if (only[0] && (nh != only[0] || L != only[1] || B != only[2])) continue;
        const int pps = L / page;
        const int64_t rb = k3::mla_row_bytes(dt, kKr, kDr), page_bytes = (page * rb + 15) / 16 * 16;
        const size_t rows_bytes = static_cast<size_t>(B) * L * rb;
        const int copies = static_cast<int>(std::max<size_t>(1, (size_t{512} << 20) / rows_bytes + 1));
        const size_t set_pages = static_cast<size_t>(B) * pps, region_pages = set_pages * copies;
        DeviceBuffer cache(region_pages * page_bytes), q(static_cast<size_t>(B) * nh * kCd * 4),
            o(static_cast<size_t>(B) * nh * kKr * 4);
        K3_CUDA_CHECK(k3::cuda::fill_uniform_f32(q.get<float>(), static_cast<int64_t>(B) * nh * kCd, -0.1f, 0.1f, 4, nullptr));
        // Disjoint copies of the rows (>= 512 MB in all): consecutive calls never find theirs in L2. Each
        // copy of each sequence is a sequence of its own for the writer.
        std::vector<uint8_t*> pages;
        for (size_t p = 0; p < region_pages; ++p) pages.push_back(cache.get<uint8_t>() + p * page_bytes);
        const int n_all = B * copies;
        std::vector<int32_t> pstart, ptok(static_cast<size_t>(n_all), page), tseq, tpos(static_cast<size_t>(B), L - 1);
        std::vector<int64_t> lstride(static_cast<size_t>(n_all), 0);
        for (int s = 0; s < n_all; ++s) pstart.push_back(s * pps);
        for (int s = 0; s < B; ++s) tseq.push_back(s);
        DeviceBuffer dp = upload(pages), dps = upload(pstart), dpt = upload(ptok), dls = upload(lstride),
                     dts = upload(tseq), dtp = upload(tpos);
        {  // Rows from uniform latents, written by mla_write_rows in chunks of 64k tokens.
          const int chunk = 65536;
          DeviceBuffer lat(static_cast<size_t>(chunk) * kCd * 4);
          K3_CUDA_CHECK(k3::cuda::fill_uniform_f32(lat.get<float>(), int64_t{chunk} * kCd, -1, 1, 3, nullptr));
          std::vector<int32_t> wseq, wpos;
          for (int s = 0; s < n_all; ++s)
            for (int p = 0; p < L; ++p) {
              wseq.push_back(s);
              wpos.push_back(p);
            }
          DeviceBuffer dws = upload(wseq), dwp = upload(wpos);
          for (size_t t0 = 0; t0 < wseq.size(); t0 += chunk) {
            const k3::cuda::MlaPaging wpg{dp.get<uint8_t* const>(), dps.get<int32_t>(), dpt.get<int32_t>(), dls.get<int64_t>(),
                                          dws.get<int32_t>() + t0, dwp.get<int32_t>() + t0, 0, kKr, kDr, dt};
            K3_CUDA_CHECK(k3::cuda::mla_write_rows(wpg, static_cast<int>(std::min<size_t>(chunk, wseq.size() - t0)),
                                                   lat.get<float>(), nullptr));
          }
          K3_CUDA_CHECK(cudaDeviceSynchronize());
        }
        DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(B, nh, kKr)) * 4);
        auto launch = [&](int r) {
          const k3::cuda::MlaPaging pg{dp.get<uint8_t* const>(), dps.get<int32_t>() + static_cast<size_t>(r % copies) * B,
                                       dpt.get<int32_t>(), dls.get<int64_t>(), dts.get<int32_t>(), dtp.get<int32_t>(),
                                       0, kKr, kDr, dt};
          K3_CUDA_CHECK(k3::cuda::mla_attend_latent(pg, B, nh, q.get<float>(), 0.07f, o.get<float>(), ws.get<float>(), nullptr));
        };
        // Two warm-up calls, one to size the run (~100 ms), then back-to-back calls between two events.
        auto time_path = [&](const char* path) {
          setenv("K3_MLA_DECODE", path, 1);
          cudaEvent_t a, e;
          cudaEventCreate(&a);
          cudaEventCreate(&e);
          launch(0);
          launch(1);
          cudaEventRecord(a);
          launch(2);
          cudaEventRecord(e);
          cudaEventSynchronize(e);
          float ms = 0;
          cudaEventElapsedTime(&ms, a, e);
          const int reps = std::clamp(static_cast<int>(100.f / std::max(ms, 1e-3f)), 3, 200);
          cudaEventRecord(a);
          for (int r = 0; r < reps; ++r) launch(r + 3);
          cudaEventRecord(e);
          cudaEventSynchronize(e);
          cudaEventElapsedTime(&ms, a, e);
          K3_CUDA_CHECK(cudaGetLastError());
          cudaEventDestroy(a);
          cudaEventDestroy(e);
          unsetenv("K3_MLA_DECODE");
          return ms * 1000.0 / reps;
        };
        // The SIMT kernel only where it takes well under a second in all (K3_MLA_TIMING_SIMT=1: always).
        const bool simt = std::getenv("K3_MLA_TIMING_SIMT") || static_cast<double>(B) * L * nh <= 64.0 * 8192 * 32;
        const double us_simt = simt ? time_path("simt") : 0.0, us_tc = time_path("tc");
        const bool wg = k3::cuda::mla_wg::supports(kKr, kDr, dt);
        const double us_wg = wg ? time_path("wgmma") : 0.0;
        const double flop = 2.0 * B * L * nh * (kCd + kKr);
        std::printf("[ timing ] mla decode %-8s nh=%2d L=%5d batch %3d: simt %9.1f us | tc %8.1f us %6.0f GB/s "
                    "%5.1f TFLOP/s (%4.1f%%, splits %d)",
                    dtype_name(dt), nh, L, B, us_simt, us_tc, rows_bytes / us_tc / 1e3, flop / us_tc / 1e6,
                    rows_bytes / us_tc / 1e3 / 48.0, k3::cuda::mla_tc::splits(B, nh, dt));
        if (wg)
          std::printf(" | wgmma %8.1f us %6.0f GB/s %5.1f TFLOP/s (%4.1f%% of 4.8 TB/s, splits %d) %.2fx tc",
                      us_wg, rows_bytes / us_wg / 1e3, flop / us_wg / 1e6, rows_bytes / us_wg / 1e3 / 48.0,
                      k3::cuda::mla_wg::splits(B, nh), us_tc / us_wg);
        std::printf("\n");
      }
}

}  // namespace
