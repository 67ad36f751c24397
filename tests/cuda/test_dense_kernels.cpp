// CUDA dense / MLA kernels against the CPU backend on random inputs: projections (bf16 and fp32
// weights, GEMV and cuBLASLt paths, both GEMM precisions), RMSNorm, Attention Residuals, and the
// absorbed MLA attention over a paged latent cache. Tolerances: fp32 paths 1e-5 relative; the GEMM path
// with activations rounded to bf16 1e-2, split into bf16 hi + lo 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <cstring>
#include <vector>

#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/linear_skinny.h"
#include "k3/backend/cuda/mla_kernels.h"
#include "k3/core/dtype.h"
#include "cpu_graph_ref.h"
#include "mla_paged_cache.h"

namespace {

using k3::cuda::DeviceBuffer;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  K3_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}
std::vector<float> download(const DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  K3_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  return v;
}
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    md = std::max(md, std::fabs(static_cast<double>(a[i]) - b[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(b[i])));
  }
  return md / std::max(mr, 1e-30);
}

// Tolerance of LinearRunner against cpu::matmul: fp32 weights and the GEMV path are fp32 throughout;
// bf16 weights on the GEMM path round x to bf16 (GemmPrecision::Bf16, ~3e-3) or split it into bf16
// hi + lo (Bf16x2, ~1e-5: the bound also catches a lo GEMM that does not accumulate).
// 2..32 tokens on bf16 weights with cols % 32 == 0 take the tensor-core skinny path in either precision
// (hi + lo halves, ~fp32: 2e-5).
// (16-byte aligned weights only; an unaligned one takes the GEMV / cuBLASLt path.)
double linear_tol(bool bf16_weights, int64_t n, k3::cuda::GemmPrecision p, int64_t cols, bool w_aligned = true) {
  if (bf16_weights && w_aligned && n >= k3::cuda::kSkinnyMinTokens && n <= k3::cuda::kSkinnyMaxTokens && cols % 32 == 0)
    return 2e-5;
  if (!bf16_weights || n <= k3::cuda::LinearRunner::kGemvMaxTokens) return 1e-5;
  return p == k3::cuda::GemmPrecision::Bf16 ? 1e-2 : 1e-4;
}
const char* precision_name(k3::cuda::GemmPrecision p) {
  return p == k3::cuda::GemmPrecision::Bf16 ? "bf16" : "bf16x2";
}

// A random weight matrix on the host in both storages (fp32 values and their bf16 rounding) and the CPU
// reference's view of one of them.
struct HostWeight {
  int64_t rows, cols;
  std::vector<float> f;
  std::vector<uint16_t> b;
  HostWeight(int64_t r, int64_t c, uint64_t seed) : rows(r), cols(c), f(randn(static_cast<size_t>(r * c), seed, 0.05f)), b(f.size()) {
    for (size_t i = 0; i < f.size(); ++i) b[i] = k3::f32_to_bf16(f[i]);
  }
  const void* data(bool bf16) const { return bf16 ? static_cast<const void*>(b.data()) : static_cast<const void*>(f.data()); }
  k3::WeightMatrix view(bool bf16) const {
    k3::WeightMatrix W;
    W.rows = rows;
    W.cols = cols;
    W.format = bf16 ? k3::WeightFormat::BF16 : k3::WeightFormat::F32;
    W.data = data(bf16);
    return W;
  }
};

TEST(CudaLinear, MatchesCpuMatmul) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::GemmPrecision;
  k3::cuda::LinearRunner lin_x2(nullptr, GemmPrecision::Bf16x2), lin_1(nullptr, GemmPrecision::Bf16);
  struct Shape { int64_t rows, cols; };
  for (const Shape s : {Shape{33, 96}, Shape{128, 128}, Shape{1000, 2304}, Shape{4096, 512}, Shape{17, 40},
                        Shape{65, 37}, Shape{130, 1023}}) {
    for (int wt = 0; wt < 2; ++wt) {
      const HostWeight hw(s.rows, s.cols, 1 + s.rows);
      const k3::WeightMatrix W = hw.view(wt == 0);
      DeviceBuffer dw = wt == 0 ? upload(hw.b) : upload(hw.f);
      k3::cuda::DeviceLinear D{wt == 0 ? k3::WeightFormat::BF16 : k3::WeightFormat::F32, dw.get(), nullptr, s.rows, s.cols};
      for (int64_t n : {1, 3, 8, 9, 64, 300}) {
        const auto x = randn(static_cast<size_t>(n * s.cols), 7 + n);
        std::vector<float> ref(static_cast<size_t>(n * s.rows));
        k3::cpu::matmul(W, x.data(), n, ref.data());
        DeviceBuffer dx = upload(x), dy(ref.size() * 4);
        for (k3::cuda::LinearRunner* lin : {&lin_x2, &lin_1}) {
          const GemmPrecision p = lin == &lin_x2 ? GemmPrecision::Bf16x2 : GemmPrecision::Bf16;
          K3_CUDA_CHECK(cudaMemset(dy.get(), 0xff, ref.size() * 4));  // NaN: every output must be written
          lin->run(D, dx.get<float>(), n, dy.get<float>());
          K3_CUDA_CHECK(cudaDeviceSynchronize());
          const double e = rel_err(download(dy, ref.size()), ref);
          EXPECT_LT(e, linear_tol(wt == 0, n, p, s.cols))
              << s.rows << "x" << s.cols << " n=" << n << " w=" << (wt ? "f32" : "bf16") << " " << precision_name(p);
          if (n == 1 || n == 3 || n == 64)
            std::printf("[ linear ] %5lld x %5lld %s n=%-3lld %-6s rel %.2e\n", (long long)s.rows, (long long)s.cols,
                        wt ? "f32 " : "bf16", (long long)n, precision_name(p), e);
        }
      }
    }
  }
}

// The GEMM path with W, x and y one element past an aligned address (2-byte aligned bf16 weights, 4-byte
// aligned fp32 x and y: what sub-allocated weights or offsets into activation buffers give), after the
// same shapes ran on aligned buffers, so an algorithm chosen for aligned pointers must not be reused.
TEST(CudaLinear, UnalignedPointers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::GemmPrecision;
  for (const GemmPrecision p : {GemmPrecision::Bf16x2, GemmPrecision::Bf16}) {
    k3::cuda::LinearRunner lin(nullptr, p);
    struct Shape { int64_t rows, cols; };
    for (const Shape s : {Shape{256, 512}, Shape{77, 129}}) {
      for (int wt = 0; wt < 2; ++wt) {
        const size_t esz = wt == 0 ? 2 : 4;
        const HostWeight hw(s.rows, s.cols, 11 + s.cols);
        const k3::WeightMatrix W = hw.view(wt == 0);
        const void* wsrc = hw.data(wt == 0);
        DeviceBuffer dw((hw.f.size() + 1) * esz);
        for (int64_t n : {9, 33}) {
          const auto x = randn(static_cast<size_t>(n * s.cols), 5 + n);
          std::vector<float> ref(static_cast<size_t>(n * s.rows));
          k3::cpu::matmul(W, x.data(), n, ref.data());
          DeviceBuffer dx((x.size() + 1) * 4), dy((ref.size() + 1) * 4);
          for (int off = 0; off < 2; ++off) {  // aligned first, then one element in
            char* w = dw.get<char>() + off * esz;
            float* xd = dx.get<float>() + off;
            float* yd = dy.get<float>() + off;
            K3_CUDA_CHECK(cudaMemcpy(w, wsrc, hw.f.size() * esz, cudaMemcpyHostToDevice));
            K3_CUDA_CHECK(cudaMemcpy(xd, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
            K3_CUDA_CHECK(cudaMemset(yd, 0xff, ref.size() * 4));
            k3::cuda::DeviceLinear D{wt == 0 ? k3::WeightFormat::BF16 : k3::WeightFormat::F32, w, nullptr, s.rows, s.cols};
            lin.run(D, xd, n, yd);
            K3_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<float> got(ref.size());
            K3_CUDA_CHECK(cudaMemcpy(got.data(), yd, got.size() * 4, cudaMemcpyDeviceToHost));
            EXPECT_LT(rel_err(got, ref), linear_tol(wt == 0, n, p, s.cols, off == 0))
                << s.rows << "x" << s.cols << " n=" << n << " w=" << (wt ? "f32" : "bf16") << " " << precision_name(p)
                << (off ? " unaligned" : " aligned");
          }
        }
      }
    }
  }
}

// The fused residual add + norm equals add_inplace then rmsnorm bit for bit (the graph's add_rmsnorm), and the
// CPU's add + rmsnorm within float tolerance; rows at a stride wider than dim keep their tail untouched. Widths take
// the register-held kernels (1, 2 and 4 float4 a thread) and, at 1001 (stride 1009), the looped ones.
TEST(CudaDense, AddRmsnormEqualsAddThenRmsnorm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int H : {96, 2304, 7168, 1001, 12288}) {  // 1001: the looped kernels; 12288: 4 float4 a thread
    const int n = 5, stride = H + 8;
    const auto y0 = randn(static_cast<size_t>(n * stride), 11, 1.5f), x = randn(static_cast<size_t>(n * stride), 12, 0.7f),
               w = randn(static_cast<size_t>(H), 13);
    DeviceBuffer dy1 = upload(y0), dy2 = upload(y0), dx = upload(x), dw = upload(w);
    DeviceBuffer do1 = upload(y0), do2 = upload(y0);  // tails past H must survive in out
    for (int r = 0; r < n; ++r)  // the separate path: add row by row (add_inplace takes a contiguous count)
      K3_CUDA_CHECK(k3::cuda::add_inplace(dy1.get<float>() + r * stride, dx.get<float>() + r * stride, H, nullptr));
    K3_CUDA_CHECK(k3::cuda::rmsnorm(dy1.get<float>(), dw.get<float>(), n, H, stride, 1e-5f, do1.get<float>(), nullptr));
    K3_CUDA_CHECK(k3::cuda::add_rmsnorm(dy2.get<float>(), dx.get<float>(), dw.get<float>(), n, H, stride, 1e-5f,
                                        do2.get<float>(), nullptr));
    const auto y1 = download(dy1, y0.size()), y2 = download(dy2, y0.size());
    const auto o1 = download(do1, y0.size()), o2 = download(do2, y0.size());
    EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << "H=" << H;
    EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * 4)) << "H=" << H;
    std::vector<float> ysum(static_cast<size_t>(n) * H), ref(ysum.size()), got(ysum.size());
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < H; ++i) {
        ysum[static_cast<size_t>(r) * H + i] = y0[static_cast<size_t>(r) * stride + i] + x[static_cast<size_t>(r) * stride + i];
        got[static_cast<size_t>(r) * H + i] = o2[static_cast<size_t>(r) * stride + i];
        EXPECT_EQ(o2[static_cast<size_t>(r) * stride + H], y0[static_cast<size_t>(r) * stride + H]) << "tail written";
      }
    k3::cpu::rmsnorm(ysum.data(), w.data(), n, H, 1e-5f, ref.data());
    EXPECT_LT(rel_err(got, ref), 1e-5) << "H=" << H;
  }
}

TEST(CudaDense, RmsnormAndAttnResMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int n = 37, H = 2304;
  const auto x = randn(static_cast<size_t>(n * H), 3, 2.0f), w = randn(static_cast<size_t>(H), 4);
  std::vector<float> ref(x.size());
  k3::cpu::rmsnorm(x.data(), w.data(), n, H, 1e-5f, ref.data());
  DeviceBuffer dx = upload(x), dw = upload(w), dy(x.size() * 4);
  K3_CUDA_CHECK(k3::cuda::rmsnorm(dx.get<float>(), dw.get<float>(), n, H, H, 1e-5f, dy.get<float>(), nullptr));
  const double e1 = rel_err(download(dy, x.size()), ref);
  EXPECT_LT(e1, 1e-5);
  // Attention Residuals over m = 1..9 sources: m - 1 blocks (one buffer, as the graph keeps them) + the partial sum.
  for (int m : {1, 2, 9}) {
    std::vector<std::vector<float>> src;
    std::vector<const float*> hp;
    std::vector<float> blocks(static_cast<size_t>(std::max(m - 1, 1) * n * H));
    for (int i = 0; i < m; ++i) {
      src.push_back(randn(static_cast<size_t>(n * H), 100 + i, 1.0f + i));
      hp.push_back(src.back().data());
      if (i < m - 1) std::copy(src.back().begin(), src.back().end(), blocks.begin() + static_cast<int64_t>(i) * n * H);
    }
    const std::vector<float> aww = randn(static_cast<size_t>(H), 9, 0.05f);
    std::vector<float> r(static_cast<size_t>(n * H));
    k3test::cpu_attn_res_mix(hp, aww, n, H, 1e-5f, r.data());
    DeviceBuffer dblocks = upload(blocks), dpart = upload(src.back()), daw = upload(aww), dout(r.size() * 4);
    K3_CUDA_CHECK(k3::cuda::attn_res_mix(dblocks.get<float>(), int64_t{n} * H, m - 1, dpart.get<float>(), daw.get<float>(), n, H,
                                         1e-5f, dout.get<float>(), nullptr));
    const double e = rel_err(download(dout, r.size()), r);
    // Fused with the following RMSNorm (the model's use).
    const auto nw = randn(static_cast<size_t>(H), 77);
    std::vector<float> rn(r.size());
    k3::cpu::rmsnorm(r.data(), nw.data(), n, H, 1e-5f, rn.data());
    DeviceBuffer dnw = upload(nw);
    K3_CUDA_CHECK(k3::cuda::attn_res_mix_rmsnorm(dblocks.get<float>(), int64_t{n} * H, m - 1, dpart.get<float>(), daw.get<float>(), n, H, 1e-5f,
                                                 dnw.get<float>(), dout.get<float>(), nullptr));
    const double ef = rel_err(download(dout, rn.size()), rn);
    std::printf("[ dense ] rmsnorm rel %.2e; attn_res m=%d rel %.2e; fused with rmsnorm rel %.2e\n", e1, m, e, ef);
    EXPECT_LT(e, 1e-5);
    EXPECT_LT(ef, 1e-5);
  }
}

// Absorbed MLA attention over a paged cache (pages of 2 MLA layers, layer 1 read; mla_paged_cache.h)
// against cpu::mla_attention_latent_rows_typed over the same stored rows, every cache dtype: the fp32
// SIMT path (forced; the tensor-core path, default from 16 heads, is held to its bf16 bar in
// test_mla_decode.cpp), small shapes (kr 32 / 64) included.
TEST(CudaMla, LatentAttentionMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  setenv("K3_MLA_DECODE", "simt", 1);
  struct Unset {
    ~Unset() { unsetenv("K3_MLA_DECODE"); }
  } unset;
  struct Case { int nh, kr, dr, P, T, page; };
  for (const k3::CacheDType dt : {k3::CacheDType::F32, k3::CacheDType::BF16, k3::CacheDType::FP8_E4M3})
    for (const Case c : {Case{4, 32, 8, 0, 13, 16}, Case{3, 64, 16, 40, 1, 16}, Case{32, 512, 64, 300, 4, 256},
                         Case{96, 512, 64, 1000, 1, 16}}) {
      const int cd = c.kr + c.dr, S = c.P + c.T;
      k3_test::MlaPagedCache cache(dt, c.kr, c.dr, 2, {{S, c.page}});
      cache.fill_layer_random(1, 5);
      const auto q = randn(static_cast<size_t>(c.T * c.nh * cd), 6, 0.2f);
      const std::vector<const void*> rows = cache.host_rows(1, 0);
      const float scale = 1.0f / std::sqrt(192.0f);
      std::vector<float> ref(static_cast<size_t>(c.T * c.nh * c.kr));
      k3::cpu::mla_attention_latent_rows_typed(c.T, c.P, c.nh, c.kr, c.dr, q.data(), rows.data(), dt, scale, ref.data());
      DeviceBuffer dq = upload(q), dout(ref.size() * 4);
      std::vector<int32_t> tseq, tpos;
      for (int t = 0; t < c.T; ++t) {
        tseq.push_back(0);
        tpos.push_back(c.P + t);
      }
      DeviceBuffer dts = upload(tseq), dtp = upload(tpos);
      const k3::cuda::MlaPaging pg = cache.paging(1, dts.get<int32_t>(), dtp.get<int32_t>());
      // Without a workspace: one key range per block; with one: the split-key path and its merge.
      K3_CUDA_CHECK(k3::cuda::mla_attend_latent(pg, c.T, c.nh, dq.get<float>(), scale, dout.get<float>(), nullptr, nullptr));
      const double e = rel_err(download(dout, ref.size()), ref);
      DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(c.T, c.nh, c.kr)) * 4);
      K3_CUDA_CHECK(cudaMemset(dout.get(), 0xff, ref.size() * 4));
      K3_CUDA_CHECK(k3::cuda::mla_attend_latent(pg, c.T, c.nh, dq.get<float>(), scale, dout.get<float>(), ws.get<float>(),
                                                nullptr));
      const double es = rel_err(download(dout, ref.size()), ref);
      std::printf("[ mla ] %-8s nh=%d kr=%d P=%d T=%d page=%d rel %.2e (split x%d: %.2e)\n", k3::cache_dtype_name(dt), c.nh,
                  c.kr, c.P, c.T, c.page, e, k3::cuda::mla_attend_splits(c.T, c.nh), es);
      EXPECT_LT(e, 1e-5) << k3::cache_dtype_name(dt);
      EXPECT_LT(es, 1e-5) << k3::cache_dtype_name(dt);
    }
}

// Decode-batch absorption kernels against host loops (real MLA head sizes).
TEST(CudaMla, SmallBatchAbsorbAndUpProjectionMatchHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int N : {1, 5, 11}) {
    const int nh = 4, dn = 128, dr = 64, dv = 128, kr = 512, cd = kr + dr;
    const auto q = randn(static_cast<size_t>(N * nh * (dn + dr)), 21 + N), kvb = randn(static_cast<size_t>(nh * (dn + dv) * kr), 22, 0.05f),
               ol = randn(static_cast<size_t>(N * nh * kr), 23 + N);
    std::vector<float> ql_ref(static_cast<size_t>(N * nh * cd), 0.f), o_ref(static_cast<size_t>(N * nh * dv), 0.f);
    for (int t = 0; t < N; ++t)
      for (int h = 0; h < nh; ++h) {
        for (int j = 0; j < kr; ++j) {
          double acc = 0;
          for (int i = 0; i < dn; ++i)
            acc += static_cast<double>(q[static_cast<size_t>((t * nh + h) * (dn + dr) + i)]) * kvb[static_cast<size_t>((h * (dn + dv) + i) * kr + j)];
          ql_ref[static_cast<size_t>((t * nh + h) * cd + j)] = static_cast<float>(acc);
        }
        for (int i = 0; i < dv; ++i) {
          double acc = 0;
          for (int j = 0; j < kr; ++j)
            acc += static_cast<double>(kvb[static_cast<size_t>((h * (dn + dv) + dn + i) * kr + j)]) * ol[static_cast<size_t>((t * nh + h) * kr + j)];
          o_ref[static_cast<size_t>((t * nh + h) * dv + i)] = static_cast<float>(acc);
        }
      }
    DeviceBuffer dq = upload(q), dk = upload(kvb), dol = upload(ol), dql(ql_ref.size() * 4), dout(o_ref.size() * 4);
    K3_CUDA_CHECK(cudaMemset(dql.get(), 0, ql_ref.size() * 4));
    K3_CUDA_CHECK(k3::cuda::mla_absorb_q(dq.get<float>(), dk.get<float>(), N, nh, dn, dr, dv, kr, dql.get<float>(), nullptr));
    K3_CUDA_CHECK(k3::cuda::mla_up_v(dol.get<float>(), dk.get<float>(), N, nh, dn, dv, kr, dout.get<float>(), nullptr));
    auto got_ql = download(dql, ql_ref.size());
    for (int t = 0; t < N; ++t)  // the rope part: copied bit for bit beside the absorbed values
      for (int h = 0; h < nh; ++h)
        for (int j = kr; j < cd; ++j) {
          const size_t at = static_cast<size_t>((t * nh + h) * cd + j);
          ASSERT_EQ(got_ql[at], q[static_cast<size_t>((t * nh + h) * (dn + dr) + dn + j - kr)]) << "rope slot N=" << N;
          got_ql[at] = 0.f;
        }
    const double e1 = rel_err(got_ql, ql_ref), e2 = rel_err(download(dout, o_ref.size()), o_ref);
    std::printf("[ mla ] small-batch absorb N=%d rel %.2e, up-projection rel %.2e\n", N, e1, e2);
    EXPECT_LT(e1, 1e-5);
    EXPECT_LT(e2, 1e-5);
  }
}

}  // namespace

namespace {

// Bandwidth of the decode-path GEMV (bf16 weights) and of the absorbed MLA decode attention. Prints only.
// The GEMV cycles through enough copies of the weight that each call reads it from HBM, not L2.
TEST(CudaDenseTiming, GemvAndLatentAttention) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape { int64_t rows, cols; const char* what; };
  for (const Shape s : {Shape{4096, 2304, "Kimi-Linear KDA q/k/v"}, Shape{2304, 4096, "Kimi-Linear KDA o"},
                        Shape{12288, 7168, "K3 KDA q/k/v"}, Shape{163840, 2304, "Kimi-Linear lm_head"}}) {
    const int64_t bytes = s.rows * s.cols * 2;
    const int copies = static_cast<int>(std::max<int64_t>(2, (512ll << 20) / bytes));
    DeviceBuffer w(static_cast<size_t>(bytes * copies));
    K3_CUDA_CHECK(k3::cuda::fill_uniform_bf16(w.get<uint16_t>(), s.rows * s.cols * copies, 0.05f, 1, nullptr));
    for (int n : {1, 8}) {
      DeviceBuffer x(static_cast<size_t>(n * s.cols) * 4), y(static_cast<size_t>(n * s.rows) * 4);
      K3_CUDA_CHECK(k3::cuda::fill_uniform_f32(x.get<float>(), n * s.cols, -1.f, 1.f, 2, nullptr));
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      const int reps = 50;
      for (int r = -5; r < reps; ++r) {
        if (r == 0) cudaEventRecord(a);
        k3::cuda::DeviceLinear D{k3::WeightFormat::BF16, w.get<uint16_t>() + (static_cast<int64_t>(r + 5) % copies) * s.rows * s.cols,
                                 nullptr, s.rows, s.cols};
        K3_CUDA_CHECK(k3::cuda::linear_gemv(D, x.get<float>(), n, y.get<float>(), nullptr));
      }
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      const double us = ms * 1000.0 / reps;
      std::printf("[ timing ] gemv bf16 %6lld x %5lld n=%d (%s): %8.2f us  %7.1f GB/s  %5.1f%% of 4.8 TB/s\n",
                  (long long)s.rows, (long long)s.cols, n, s.what, us, bytes / us / 1e3, bytes / us / 1e3 / 48.0);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
  // Absorbed MLA decode attention, one token per sequence, context L.
  for (const int nh : {32, 96}) {
    for (const int L : {1024, 8192}) {
      const int kr = 512, dr = 64, cd = kr + dr, B = 8, page = 16;
      const int pages_per_seq = (L + page - 1) / page;
      DeviceBuffer cache(static_cast<size_t>(B) * pages_per_seq * page * cd * 4), q(static_cast<size_t>(B) * nh * cd * 4),
          o(static_cast<size_t>(B) * nh * kr * 4);
      K3_CUDA_CHECK(k3::cuda::fill_uniform_f32(cache.get<float>(), static_cast<int64_t>(B) * pages_per_seq * page * cd, -1, 1, 3, nullptr));
      K3_CUDA_CHECK(k3::cuda::fill_uniform_f32(q.get<float>(), static_cast<int64_t>(B) * nh * cd, -0.1f, 0.1f, 4, nullptr));
      std::vector<uint8_t*> pages;
      std::vector<int32_t> pstart, ptok, tseq, tpos;
      const std::vector<int64_t> lstride(static_cast<size_t>(B), 0);
      for (int s = 0; s < B; ++s) {
        pstart.push_back(s * pages_per_seq);
        ptok.push_back(page);
        tseq.push_back(s);
        tpos.push_back(L - 1);
        for (int p = 0; p < pages_per_seq; ++p)
          pages.push_back(reinterpret_cast<uint8_t*>(cache.get<float>() + (static_cast<size_t>(s) * pages_per_seq + p) * page * cd));
      }
      DeviceBuffer dp = upload(pages), dps = upload(pstart), dpt = upload(ptok), dls = upload(lstride), dts = upload(tseq),
                   dtp = upload(tpos);
      const k3::cuda::MlaPaging pg{dp.get<uint8_t* const>(), dps.get<int32_t>(), dpt.get<int32_t>(), dls.get<int64_t>(),
                                   dts.get<int32_t>(), dtp.get<int32_t>(), 0, kr, dr, k3::CacheDType::F32};
      DeviceBuffer ws(std::max<size_t>(1, k3::cuda::mla_attend_workspace_floats(B, nh, kr)) * 4);
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      for (int r = -2; r < 10; ++r) {
        if (r == 0) cudaEventRecord(a);
        K3_CUDA_CHECK(k3::cuda::mla_attend_latent(pg, B, nh, q.get<float>(), 0.07f, o.get<float>(), ws.get<float>(), nullptr));
      }
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      const double us = ms * 100.0, cache_bytes = static_cast<double>(B) * L * cd * 4;
      std::printf("[ timing ] mla decode attention nh=%2d L=%5d batch %d: %8.1f us  (latent rows %.1f MB: %6.1f GB/s once, "
                  "%.0f%% of 4.8 TB/s)\n",
                  nh, L, B, us, cache_bytes / 1e6, cache_bytes / us / 1e3, cache_bytes / us / 1e3 / 48.0);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace
