// CUDA MoE kernels (moe_route, moe_experts) against the CPU reference k3::moe_layer, plus timing lines.
// The experts are random host arrays viewed as k3::WeightMatrix (bf16, or MXFP4 packed + E8M0 scales);
// router logits are computed once on the host with k3::cpu::matmul (what moe_layer computes internally)
// and uploaded, so both sides route from identical logits.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/moe_decode.h"
#include "k3/backend/cuda/moe_decode_w4a8.h"
#include "k3/backend/cuda/moe_grouped_gemm.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/core/dtype.h"
#include "k3/core/error.h"
#include "k3/backend/cuda/moe_gemv.h"
#include "k3/core/weight.h"
#include "k3/model/config.h"
#include "cpu_graph_ref.h"
#include "k3/model/weights.h"

namespace {

using k3::cuda::DecVariant;
using k3::cuda::GluAct;
using k3::cuda::MoePath;
using k3::cuda::MoePrecision;

// The expert paths every correctness check runs, each against the same CPU reference, with its tolerance
// (max |gpu - cpu| / max |cpu|): SIMT fp32; tensor cores with split bf16x2 activations; plain bf16.
struct PathCfg {
  MoePath path;
  MoePrecision prec;
  double tol;
  const char* name;
  int cutlass_tile = 128;  // MoePath::Cutlass: rows of its output tiles, forced (moe_cutlass::set_tile_m)
};
const PathCfg kPaths[] = {
    {MoePath::Simt, MoePrecision::Bf16x2, 1e-4, "simt"},
    {MoePath::TensorCore, MoePrecision::Bf16x2, 1e-4, "tc-bf16x2"},
    {MoePath::TensorCore, MoePrecision::Bf16, 2e-2, "tc-bf16"},
    {MoePath::TcDecode, MoePrecision::Bf16x2, 1e-4, "dec-bf16x2"},
    {MoePath::TcDecode, MoePrecision::Bf16, 2e-2, "dec-bf16"},
    {MoePath::Auto, MoePrecision::Bf16x2, 1e-4, "auto"},
    {MoePath::Gemv, MoePrecision::Bf16x2, 1e-4, "gemv"},
    // The warpgroup-MMA tiles (sm_90a; skipped on other devices): the same tolerances as the mma.sync tiles.
    {MoePath::Wgmma, MoePrecision::Bf16x2, 1e-4, "wg-bf16x2"},
    {MoePath::Wgmma, MoePrecision::Bf16, 2e-2, "wg-bf16"},
    // Their register-A form (MXFP4 banks only; skipped on BF16 ones).
    {MoePath::WgmmaRs, MoePrecision::Bf16x2, 1e-4, "wgrs-bf16x2"},
    {MoePath::WgmmaRs, MoePrecision::Bf16, 2e-2, "wgrs-bf16"},
    // The ring form (MXFP4 banks with X and I multiples of 64; skipped on others).
    {MoePath::WgmmaRing, MoePrecision::Bf16x2, 1e-4, "wgring-bf16x2"},
    {MoePath::WgmmaRing, MoePrecision::Bf16, 2e-2, "wgring-bf16"},
    // CUTLASS's grouped GEMMs (BF16 banks with I <= X, sm_90a; skipped on MXFP4 banks): the tiles' numerics.
    {MoePath::Cutlass, MoePrecision::Bf16x2, 1e-4, "cutlass-bf16x2"},
    {MoePath::Cutlass, MoePrecision::Bf16, 2e-2, "cutlass-bf16"},
    {MoePath::Cutlass, MoePrecision::Bf16x2, 1e-4, "cutlass64-bf16x2", 64},
};
constexpr size_t kAutoPath = 5;  // index of Auto in kPaths

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Compute capability 9.0 (H100 / H200): where the sm_90a wgmma tiles must run for every MXFP4 / BF16 test bank,
// so a Wgmma path is never skipped there.
bool device_is_cc90() {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 && minor == 0;
}

// splitmix64: fast, and chunks seeded independently fill big arrays in parallel reproducibly.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float normal() {  // Box-Muller
    const float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

// fill(i, rng) for i in [0, n), in parallel chunks with per-chunk seeds.
template <typename F>
void parallel_fill(size_t n, uint64_t seed, F fill) {
  const size_t chunk = size_t{1} << 22;
  const size_t nchunks = (n + chunk - 1) / chunk;
  const unsigned nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned w = 0; w < nt; ++w)
    th.emplace_back([&, w]() {
      for (size_t c = w; c < nchunks; c += nt) {
        Rng rng(seed * 1000003ull + c);
        for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) fill(i, rng);
      }
    });
  for (auto& t : th) t.join();
}

struct Shape {
  int E, K, X, I;
  bool mx;
  const char* name;
  // MXFP4 scales as a trained checkpoint has them (E8M0 2^-10 .. 2^-6: a QAT K3's groups of ~N(0, 0.02)
  // values) instead of the correctness tests' 2^-4 .. 2^2, whose 2^1 .. 2^2 send nearly every chunk of the
  // decode kernel down its two-multiply path for scales past 2^127 of the placed values (moe_decode.cu), the
  // path real weights never take (QAT-scale timings vs session 4's wide-scale ones, another machine: ~20% faster
  // at n = 1, within ~3% at n >= 8; docs/perf/cuda.md, session 17).
  bool qat_scales = false;
};

// Device buffer freed on destruction.
struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// One MoE layer's routed experts on host and device, plus a bf16 router and bias.
struct Moe {
  Shape sh;
  float x_std = 1.f;
  std::vector<uint8_t> pk[3], sc[3];  // gate, up, down (MXFP4)
  std::vector<uint16_t> bf[3];        // gate, up, down (bf16)
  std::vector<uint16_t> router;       // bf16 [E][X]
  std::vector<float> bias;
  std::unique_ptr<DevBuf> dw[3], ds[3];
  k3::cuda::ExpertBank bank;
  k3::MoeWeights w;

  explicit Moe(const Shape& s, uint64_t seed = 7) : sh(s) {
    const size_t E = s.E, X = s.X, I = s.I;
    const size_t elems[3] = {E * I * X, E * I * X, E * X * I};
    // Activations sized so that gate/up pre-activations are O(1..3): SiLU and SiTU are not saturated.
    x_std = s.mx ? (s.qat_scales ? 192.f : 1.5f) / std::sqrt(static_cast<float>(X)) : 100.f / std::sqrt(static_cast<float>(X));
    for (int m = 0; m < 3; ++m) {
      if (s.mx) {
        pk[m].resize(elems[m] / 2);
        sc[m].resize(elems[m] / 32);
        auto* P = pk[m].data();
        auto* S = sc[m].data();
        parallel_fill(pk[m].size(), seed * 10 + m, [P](size_t i, Rng& r) { P[i] = static_cast<uint8_t>(r.next()); });
        // E8M0 scales 2^-4 .. 2^2 (or 2^-10 .. 2^-6, qat_scales).
        const int lo = s.qat_scales ? 117 : 123, span = s.qat_scales ? 5 : 7;
        parallel_fill(sc[m].size(), seed * 10 + m + 5,
                      [S, lo, span](size_t i, Rng& r) { S[i] = static_cast<uint8_t>(lo + r.next() % span); });
      } else {
        bf[m].resize(elems[m]);
        auto* B = bf[m].data();
        // sign, exponent 2^-9 .. 2^-3, random mantissa: never zero.
        parallel_fill(bf[m].size(), seed * 10 + m, [B](size_t i, Rng& r) {
          const uint64_t v = r.next();
          B[i] = static_cast<uint16_t>(((v & 1) << 15) | ((118 + (v >> 1) % 7) << 7) | ((v >> 8) & 0x7f));
        });
      }
    }
    Rng rng(seed * 31 + 3);
    router.resize(E * X);
    const float rstd = 1.5f / (std::sqrt(static_cast<float>(X)) * x_std);  // logits ~ N(0, 1.5)
    for (auto& v : router) v = k3::f32_to_bf16(rstd * rng.normal());
    bias.resize(E);
    for (auto& b : bias) b = 0.1f * (rng.uniform() - 0.5f);  // small: changes some selections

    // Host views (CPU reference).
    w.router = k3::WeightMatrix{k3::WeightFormat::BF16, router.data(), nullptr, static_cast<int64_t>(E),
                                static_cast<int64_t>(X)};
    w.correction_bias = bias;
    w.experts.resize(E);
    for (size_t e = 0; e < E; ++e) {
      k3::GluMlp& g = w.experts[e];
      k3::WeightMatrix* mats[3] = {&g.gate, &g.up, &g.down};
      for (int m = 0; m < 3; ++m) {
        const int64_t rows = m < 2 ? I : X, cols = m < 2 ? X : I;
        k3::WeightMatrix& W = *mats[m];
        W.rows = rows;
        W.cols = cols;
        if (s.mx) {
          W.format = k3::WeightFormat::MXFP4;
          W.data = pk[m].data() + e * rows * cols / 2;
          W.scales = sc[m].data() + e * rows * cols / 32;
        } else {
          W.format = k3::WeightFormat::BF16;
          W.data = bf[m].data() + e * rows * cols;
        }
      }
    }
    // Device bank.
    bank.format = s.mx ? k3::WeightFormat::MXFP4 : k3::WeightFormat::BF16;
    bank.E = s.E;
    bank.I = s.I;
    bank.X = s.X;
    const void* wptr[3];
    const uint8_t* sptr[3] = {nullptr, nullptr, nullptr};
    for (int m = 0; m < 3; ++m) {
      const size_t bytes = s.mx ? pk[m].size() : bf[m].size() * 2;
      dw[m] = std::make_unique<DevBuf>(bytes);
      ck(cudaMemcpy(dw[m]->p, s.mx ? static_cast<const void*>(pk[m].data()) : bf[m].data(), bytes,
                    cudaMemcpyHostToDevice),
         "upload weights");
      wptr[m] = dw[m]->p;
      if (s.mx) {
        ds[m] = std::make_unique<DevBuf>(sc[m].size());
        ck(cudaMemcpy(ds[m]->p, sc[m].data(), sc[m].size(), cudaMemcpyHostToDevice), "upload scales");
        sptr[m] = ds[m]->as<uint8_t>();
      }
    }
    bank.gate = wptr[0];
    bank.up = wptr[1];
    bank.down = wptr[2];
    bank.gate_scales = sptr[0];
    bank.up_scales = sptr[1];
    bank.down_scales = sptr[2];
    if (s.mx) {  // as the loader counts it (ExpertStack::max_scale): 121 with qat_scales (the ring's narrow decode), else 129
      uint8_t mx = 0;
      for (int m = 0; m < 3; ++m) mx = std::max(mx, *std::max_element(sc[m].begin(), sc[m].end()));
      bank.max_scale = mx;
    }
  }

  // Bytes of one expert's three matrices (what a call streams per expert used).
  double expert_bytes() const {
    const double ix = static_cast<double>(sh.I) * sh.X;
    return sh.mx ? 3 * (ix / 2 + ix / 32) : 3 * ix * 2;
  }

  k3::ModelConfig config(GluAct act, bool renorm, float scale) const {
    k3::ModelConfig c;
    c.hidden_size = sh.X;
    c.num_experts = sh.E;
    c.top_k = sh.K;
    c.moe_intermediate_size = sh.I;
    c.act = act == GluAct::SiTU ? k3::Activation::SiTU : k3::Activation::SiLU;
    c.moe_renormalize = renorm;
    c.routed_scaling_factor = scale;
    if (sh.mx) c.expert_quant_format = k3::WeightFormat::MXFP4;
    c.rms_norm_eps = 1e-6f;
    return c;
  }
};

// The big banks take seconds to generate; build each once per process.
Moe& cached_moe(const Shape& s) {
  static std::vector<std::unique_ptr<Moe>> cache;
  for (auto& m : cache)
    if (m->sh.E == s.E && m->sh.K == s.K && m->sh.X == s.X && m->sh.I == s.I && m->sh.mx == s.mx &&
        m->sh.qat_scales == s.qat_scales)
      return *m;
  cache.push_back(std::make_unique<Moe>(s));
  return *cache.back();
}

// moe_layer's routing, for comparing ids and weights.
void cpu_route(const Moe& m, const k3::ModelConfig& c, const std::vector<float>& logits, int n,
               std::vector<int>& ids, std::vector<float>& wts, std::vector<float>& biased) {
  const int E = m.sh.E, K = m.sh.K;
  ids.assign(static_cast<size_t>(n) * K, 0);
  wts.assign(static_cast<size_t>(n) * K, 0);
  biased.assign(static_cast<size_t>(n) * E, 0);
  std::vector<float> s(E);
  std::vector<int> idx(E);
  for (int t = 0; t < n; ++t) {
    for (int e = 0; e < E; ++e) {
      s[e] = k3::cpu::sigmoidf(logits[static_cast<size_t>(t) * E + e]);
      biased[static_cast<size_t>(t) * E + e] = s[e] + m.bias[e];
    }
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int a, int b) {
      const float sa = s[a] + m.bias[a], sb = s[b] + m.bias[b];
      return sa > sb || (sa == sb && a < b);
    });
    float denom = 0;
    for (int j = 0; j < K; ++j) denom += s[idx[j]];
    for (int j = 0; j < K; ++j) {
      ids[static_cast<size_t>(t) * K + j] = idx[j];
      wts[static_cast<size_t>(t) * K + j] =
          (c.moe_renormalize ? s[idx[j]] / (denom + 1e-20f) : s[idx[j]]) * c.routed_scaling_factor;
    }
  }
}

// A batch on the device: x, the router logits and bias uploaded, moe_route run (ids / weights), out allocated.
struct DeviceBatch {
  DevBuf dx, dl, db, di, dwt, dout;
  DeviceBatch(const Moe& m, const std::vector<float>& x, const std::vector<float>& logits, int n, bool renorm, float scale)
      : dx(x.size() * 4), dl(logits.size() * 4), db(m.sh.E * 4), di(static_cast<size_t>(n) * m.sh.K * 4),
        dwt(static_cast<size_t>(n) * m.sh.K * 4), dout(x.size() * 4) {
    const int E = m.sh.E, K = m.sh.K;
    ck(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "x");
    ck(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "logits");
    ck(cudaMemcpy(db.p, m.bias.data(), E * 4, cudaMemcpyHostToDevice), "bias");
    ck(k3::cuda::moe_route(n, E, K, dl.as<float>(), db.as<float>(), renorm, scale, di.as<int32_t>(), dwt.as<float>(), nullptr),
       "moe_route");
    ck(cudaDeviceSynchronize(), "sync route");
  }
};

struct CheckResult {
  double rel = 0;  // max|gpu - cpu| / max|cpu| over tokens routed identically
  int tie_flips = 0;
  bool nan = false;
  bool skipped = false;   // a path this device or bank does not run (Wgmma off sm_90)
  bool not_bank = false;  // skipped for the bank, on any device (WgmmaRs on BF16 experts)
};

// Whether a forced path does not run on this bank here (its checks then skipped): the wgmma tiles and CUTLASS's grouped
// GEMMs exist for compute-capability-9.0 devices only; not_bank: the bank is not one the path takes at all (the
// register-A form: MXFP4 only; its ring form: MXFP4 with X, I multiples of 64; CUTLASS's: BF16 with I <= X).
bool path_skipped(const PathCfg& pc, const Moe& m, bool& not_bank) {
  not_bank = (pc.path == MoePath::WgmmaRs && !m.sh.mx) || (pc.path == MoePath::Cutlass && (m.sh.mx || m.sh.I > m.sh.X)) ||
             (pc.path == MoePath::WgmmaRing && (!m.sh.mx || m.sh.X % 64 != 0 || m.sh.I % 64 != 0));
  if (not_bank) return true;
  if ((pc.path == MoePath::Wgmma || pc.path == MoePath::WgmmaRs) && !k3::cuda::moe_wg::supports(m.bank)) return true;
  if (pc.path == MoePath::WgmmaRing && !k3::cuda::moe_wg::ring_supports(m.bank)) return true;
  return pc.path == MoePath::Cutlass && !k3::cuda::moe_cutlass::supports(m.bank);
}

// One CPU reference, then moe_experts once per entry of kPaths (results in that order).
std::vector<CheckResult> check_layer(Moe& m, int n, GluAct act, bool renorm, float scale, uint64_t seed) {
  const int E = m.sh.E, K = m.sh.K, X = m.sh.X;
  const k3::ModelConfig c = m.config(act, renorm, scale);
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n) * X);
  for (auto& v : x) v = m.x_std * rng.normal();
  std::vector<float> logits(static_cast<size_t>(n) * E);
  k3::cpu::matmul(m.w.router, x.data(), n, logits.data());
  std::vector<float> ref(static_cast<size_t>(n) * X);
  k3test::cpu_moe_layer(c, m.w, x.data(), n, ref.data());
  std::vector<int> rid;
  std::vector<float> rw, biased;
  cpu_route(m, c, logits, n, rid, rw, biased);

  DeviceBatch b(m, x, logits, n, renorm, scale);
  DevBuf &dx = b.dx, &di = b.di, &dwt = b.dwt, &dout = b.dout;
  k3::cuda::MoeWorkspace ws(n, K, E, m.sh.I, X);
  std::vector<int> gid(static_cast<size_t>(n) * K);
  std::vector<float> gw(gid.size()), out(x.size());
  ck(cudaMemcpy(gid.data(), di.p, gid.size() * 4, cudaMemcpyDeviceToHost), "ids");
  ck(cudaMemcpy(gw.data(), dwt.p, gw.size() * 4, cudaMemcpyDeviceToHost), "w");

  std::vector<CheckResult> results;
  for (const PathCfg& pc : kPaths) {
    bool not_bank = false;
    if (path_skipped(pc, m, not_bank)) {
      CheckResult r;
      r.skipped = true;
      r.not_bank = not_bank;
      results.push_back(r);
      continue;
    }
    ck(cudaMemset(dout.p, 0xff, x.size() * 4), "poison out");  // NaN: a missed write shows
    if (pc.path == MoePath::Cutlass) k3::cuda::moe_cutlass::set_tile_m(pc.cutlass_tile);  // Auto: the rule
    ck(k3::cuda::moe_experts(m.bank, n, K, dx.as<float>(), di.as<int32_t>(), dwt.as<float>(), act, c.situ_beta,
                             c.situ_linear_beta, dout.as<float>(), ws, nullptr, pc.prec, pc.path),
       "moe_experts");
    k3::cuda::moe_cutlass::set_tile_m(0);
    ck(cudaDeviceSynchronize(), "sync");
    ck(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost), "out");

    const bool first = &pc == &kPaths[0];  // routing checks once
    CheckResult r;
    double maxref = 0, maxdiff = 0;
    for (int t = 0; t < n; ++t) {
      bool same = true;
      for (int j = 0; j < K; ++j) same = same && gid[static_cast<size_t>(t) * K + j] == rid[static_cast<size_t>(t) * K + j];
      if (!same) {
        // Allowed only as a near-tie: rank by rank, the biased scores of the two picks within 1e-6.
        for (int j = 0; j < K && first; ++j) {
          const int a = gid[static_cast<size_t>(t) * K + j], b = rid[static_cast<size_t>(t) * K + j];
          if (a < 0 || a >= E) {
            ADD_FAILURE() << m.sh.name << " n=" << n << " token " << t << " rank " << j << ": invalid id " << a;
            break;
          }
          const float sa = biased[static_cast<size_t>(t) * E + a], sb = biased[static_cast<size_t>(t) * E + b];
          EXPECT_LE(std::fabs(sa - sb), 1e-6f) << m.sh.name << " n=" << n << " token " << t << " rank " << j
                                               << ": gpu expert " << a << " (" << sa << ") vs cpu " << b << " (" << sb << ")";
        }
        ++r.tie_flips;
        continue;  // outputs differ legitimately
      }
      for (int j = 0; j < K && first; ++j) {
        const float a = gw[static_cast<size_t>(t) * K + j], b = rw[static_cast<size_t>(t) * K + j];
        EXPECT_LE(std::fabs(a - b), 1e-6f * std::fabs(b) + 1e-30f) << m.sh.name << " token " << t << " rank " << j;
      }
      for (int d = 0; d < X; ++d) {
        const double g = out[static_cast<size_t>(t) * X + d], c0 = ref[static_cast<size_t>(t) * X + d];
        if (std::isnan(g) || std::isinf(g)) r.nan = true;
        maxref = std::max(maxref, std::fabs(c0));
        maxdiff = std::max(maxdiff, std::fabs(g - c0));
      }
    }
    r.rel = maxdiff / std::max(maxref, 1e-30);
    results.push_back(r);
  }
  return results;
}

void run_checks(const Shape& s, const std::vector<int>& ns, GluAct act, bool renorm, float scale) {
  Moe& m = cached_moe(s);
  for (int n : ns) {
    const std::vector<CheckResult> rs = check_layer(m, n, act, renorm, scale, 1000 + n);
    const MoePath auto_path = k3::cuda::moe_experts_auto_path(n, s.K, s.E, s.mx ? k3::WeightFormat::MXFP4 : k3::WeightFormat::BF16);
    for (size_t i = 0; i < rs.size(); ++i) {
      const CheckResult& r = rs[i];
      const PathCfg& pc = kPaths[i];
      // '*': the forced path Auto picks here.
      if (r.skipped) {
        std::printf("[ moe ] %-12s n=%4d  %-9s skipped (not this device or bank)\n", s.name, n, pc.name);
        if (!r.not_bank) {
          EXPECT_FALSE(device_is_cc90()) << s.name << ": " << pc.name << " skipped on a compute-capability-9.0 device";
        }
        continue;
      }
      const bool is_auto = pc.path == auto_path && pc.prec == MoePrecision::Bf16x2;
      std::printf("[ moe ] %-12s E=%d K=%d X=%d I=%d %s %s renorm=%d scale=%.2f n=%4d  %-9s%s max_rel %.2e  tie flips %d\n",
                  s.name, s.E, s.K, s.X, s.I, s.mx ? "mxfp4" : "bf16 ", act == GluAct::SiTU ? "SiTU" : "SiLU", renorm,
                  scale, n, pc.name, is_auto ? "*" : " ", r.rel, r.tie_flips);
      EXPECT_FALSE(r.nan) << s.name << " n=" << n << " " << pc.name;
      EXPECT_LT(r.rel, pc.tol) << s.name << " n=" << n << " " << pc.name;
    }
  }
}

const std::vector<Shape>& tiny_shapes() {
  static const std::vector<Shape> v = {
      {8, 2, 96, 48, false, "tiny-kl"},     // tests/data/tiny-kimi-linear (I = 48: bf16 needs only % 8)
      {16, 4, 128, 64, true, "tiny-k3"},     // tests/data/tiny-k3
      {32, 4, 96, 96, true, "tiny-mx-96"},   // X not a multiple of 64
      {32, 3, 160, 32, false, "tiny-bf-160"},
      {32, 4, 256, 96, true, "k3-tiny"},      // models/k3-tiny
      {128, 16, 1024, 512, true, "k3-like"},  // K3's routing (K = 16) at small widths: n = 257 -> 32 pairs/expert
      {64, 8, 512, 200, false, "kl-like"},    // bf16, I = 200: N and K edge tiles (not multiples of 32 / 64)
  };
  return v;
}
const Shape kKimiLinear{256, 8, 2304, 1024, false, "kimi-linear"};
const Shape kK3{896, 16, 3584, 3072, true, "k3"};
const Shape kK3Qat{896, 16, 3584, 3072, true, "k3 qat-sc", true};

TEST(CudaMoe, TinyShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const Shape& s : tiny_shapes()) {
    run_checks(s, {1, 3, 8, 64, 257}, GluAct::SiLU, true, 1.0f);
    run_checks(s, {1, 8, 257}, GluAct::SiTU, true, 2.5f);
    run_checks(s, {3, 64}, GluAct::SiLU, false, 1.0f);
  }
}

TEST(CudaMoe, KimiLinearShape) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_checks(kKimiLinear, {1, 3, 8, 64, 257}, GluAct::SiLU, true, 2.446f);  // 64, 257: Auto = tensor cores
}

TEST(CudaMoe, K3Shape) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // n = 257 skipped: ~4k (token, expert) pairs of 3584x3072 MXFP4 GLUs is slow on the CPU reference (the
  // k3-like tiny shape covers K = 16 at n = 257). n = 64: Auto = SIMT (1024 pairs < 2 * 896); both forced.
  run_checks(kK3, {1, 3, 8, 64}, GluAct::SiTU, true, 2.5f);
}

// The scales a trained checkpoint has: the decode kernel's one-multiply path in every chunk (with the wide
// scales above nearly every chunk of this shape holds one past 2^127 of the placed values).
TEST(CudaMoe, K3ShapeQatScales) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_checks(kK3Qat, {1, 8}, GluAct::SiTU, true, 2.5f);
}

// One MoePrecision::Mxfp8 call (the path given) against the CPU backend with --moe-activation-dtype mxfp8 and with
// float32 activations, over the tokens routed alike on both sides. Token 0's first block of x is all zeros and its
// second far below 2^-87 (the W4A8 kernels stage such scale bytes as zeros: a scale product of 2^(ws - 248) and below
// would otherwise leave float's range): the output must stay finite.
struct Mxfp8Case {
  double rel8 = 0, rel32 = 0;  // max |gpu - cpu| / max |cpu mxfp8| against the two references
  double exact = 0;            // fraction of compared tokens whose max difference to cpu mxfp8 is below 1e-4 of max |cpu|
  int compared = 0;
  bool finite = true;
};
Mxfp8Case mxfp8_case(Moe& m, int n, MoePath path, uint64_t seed) {
  const int E = m.sh.E, K = m.sh.K, X = m.sh.X;
  const k3::ModelConfig c = m.config(GluAct::SiTU, true, 2.5f);
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n) * X);
  for (auto& v : x) v = m.x_std * rng.normal();
  for (int i = 0; i < std::min(64, X); ++i) x[static_cast<size_t>(i)] = i < 32 ? 0.f : 1e-30f * rng.normal();
  std::vector<float> logits(static_cast<size_t>(n) * E), ref8(x.size()), ref32(x.size()), out(x.size());
  k3::cpu::matmul(m.w.router, x.data(), n, logits.data());
  k3test::cpu_moe_layer(c, m.w, x.data(), n, ref8.data(), k3::MoeActivationDType::MXFP8);
  k3test::cpu_moe_layer(c, m.w, x.data(), n, ref32.data());
  std::vector<int> rid;
  std::vector<float> rw, biased;
  cpu_route(m, c, logits, n, rid, rw, biased);
  DeviceBatch b(m, x, logits, n, true, 2.5f);
  k3::cuda::MoeWorkspace ws(n, K, E, m.sh.I, X);
  ck(cudaMemset(b.dout.p, 0xff, x.size() * 4), "poison");
  ck(k3::cuda::moe_experts(m.bank, n, K, b.dx.as<float>(), b.di.as<int32_t>(), b.dwt.as<float>(), GluAct::SiTU, c.situ_beta,
                           c.situ_linear_beta, b.dout.as<float>(), ws, nullptr, MoePrecision::Mxfp8, path),
     "moe_experts mxfp8");
  ck(cudaDeviceSynchronize(), "sync");
  ck(cudaMemcpy(out.data(), b.dout.p, out.size() * 4, cudaMemcpyDeviceToHost), "out");
  std::vector<int> gid(static_cast<size_t>(n) * K);
  ck(cudaMemcpy(gid.data(), b.di.p, gid.size() * 4, cudaMemcpyDeviceToHost), "ids");
  Mxfp8Case r;
  double max8 = 0, d32 = 0, d8 = 0;
  std::vector<double> tok8;
  for (int t = 0; t < n; ++t) {
    if (!std::equal(gid.begin() + t * K, gid.begin() + (t + 1) * K, rid.begin() + t * K)) continue;  // a near-tie
    ++r.compared;
    double dt = 0;
    for (int d = 0; d < X; ++d) {
      const size_t i = static_cast<size_t>(t) * X + d;
      r.finite = r.finite && std::isfinite(out[i]);
      max8 = std::max(max8, std::fabs(static_cast<double>(ref8[i])));
      dt = std::max(dt, std::fabs(static_cast<double>(out[i]) - ref8[i]));
      d32 = std::max(d32, std::fabs(static_cast<double>(out[i]) - ref32[i]));
    }
    tok8.push_back(dt);
    d8 = std::max(d8, dt);
  }
  r.rel8 = d8 / max8;
  r.rel32 = d32 / max8;
  r.exact = static_cast<double>(std::count_if(tok8.begin(), tok8.end(), [&](double v) { return v < 1e-4 * max8; })) /
            std::max<size_t>(tok8.size(), 1);
  return r;
}

// --moe-activation-dtype mxfp8 (MoePrecision::Mxfp8) at decode sizes on the W4A8 kernels (FP8 wgmma,
// moe_decode_w4a8.h) against the CPU backend with the same option: x and each GLU output rounded to MXFP8 by the same
// rule (core/mxfp8.h), products in fp32 on the CPU, exact e4m3 x e2m1 products summed 32 at a time by the tensor core
// on the GPU. x's codes agree bit for bit; the tensor core sums each group's 32 exact products at reduced precision
// (~1e-4 of the sum: w4a8_bench's check, call s55-1), and an h value that lands within that of an E4M3 midpoint takes
// the neighbouring code (a 1/16 relative step of one of I inputs). Call s55-1 (H100): 1e-4 .. 6.8e-3 of max |cpu| over
// these shapes and sizes, hence 1.5e-2; against the float32 CPU reference the same outputs differ by 4.5e-2 .. 8e-2 --
// at least 4x more is required, so the check still tells the numerics apart.
TEST(CudaMoe, W4a8MatchesCpuMxfp8) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!device_is_cc90()) GTEST_SKIP() << "FP8 wgmma needs a compute-capability-9.0 device";
  const Shape shapes[] = {{64, 8, 256, 128, true, "w4a8-small", true}, {128, 16, 1024, 512, true, "k3-like-qat", true},
                          kK3Qat};
  for (const Shape& s : shapes) {
    Moe& m = cached_moe(s);
    ASSERT_TRUE(k3::cuda::moe_w4a8_supported(m.bank)) << s.name;
    for (int n : {1, 3, 8, 33}) {
      const Mxfp8Case r = mxfp8_case(m, n, MoePath::TcDecode, 4000 + n);
      std::printf("[ w4a8 ] %-12s n=%3d tokens compared %d: vs cpu mxfp8 %.2e, vs cpu float32 %.2e\n", s.name, n,
                  r.compared, r.rel8, r.rel32);
      EXPECT_TRUE(r.finite) << s.name << " n=" << n;
      EXPECT_GT(r.compared, 0) << s.name << " n=" << n;
      EXPECT_LT(r.rel8, 1.5e-2) << s.name << " n=" << n;
      EXPECT_GT(r.rel32, 4 * r.rel8) << s.name << " n=" << n << ": the output is not told apart from float32 activations";
    }
  }
}

// MoePrecision::Mxfp8's tile form (moe_kernels.h: prefill sizes, BF16 experts, banks the W4A8 kernels do not take):
// the bf16 tensor-core tiles fed x and h already rounded to MXFP8, which bf16 holds exactly, so a token none of whose
// K x I GLU outputs sits at an E4M3 midpoint gets the CPU's output to fp32 rounding (< 1e-4 of max |cpu|). The others
// differ by one code of one h value (~1e-3 .. 1e-2): with fp32 sums ~2e-6 apart, ~3e-5 of the h values flip (estimate,
// not measured), ~0.25 a token at k3-like's 16 x 512, so at least a quarter of the tokens must be within 1e-4 (numerics
// off by anything systematic -- an unrounded x or h -- leave none) and none beyond the W4A8 bound. Auto at n = 257
// (above 8 pairs an expert on the wide shapes), TensorCore forced at decode sizes, and 10000 tokens on the tiny bank
// (more than its 8192-token chunk of the scratch: two chunks).
TEST(CudaMoe, Mxfp8TilesMatchCpuMxfp8) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    Shape s;
    int n;
    MoePath path;
  };
  const Shape bf_kl{8, 2, 96, 48, false, "tiny-kl"}, mx_k3{16, 4, 128, 64, true, "tiny-k3"},
      qat{128, 16, 1024, 512, true, "k3-like-qat", true}, bf{64, 8, 512, 200, false, "kl-like"};
  const Case cases[] = {{bf_kl, 5, MoePath::Auto},       {bf_kl, 257, MoePath::Auto},  {mx_k3, 8, MoePath::Auto},
                        {mx_k3, 257, MoePath::Auto},     {qat, 8, MoePath::TensorCore}, {qat, 257, MoePath::Auto},
                        {bf, 64, MoePath::Auto},         {mx_k3, 10000, MoePath::Auto},
                        // the ring form rounding the GLU outputs in its epilogue (session 61), named
                        {mx_k3, 257, MoePath::WgmmaRing}, {qat, 257, MoePath::WgmmaRing}, {qat, 2000, MoePath::WgmmaRing}};
  for (const Case& k : cases) {
    Moe& m = cached_moe(k.s);
    const Mxfp8Case r = mxfp8_case(m, k.n, k.path, 5000 + k.n);
    const char* path = k.path == MoePath::Auto ? "auto" : k.path == MoePath::WgmmaRing ? "ring" : "tc  ";
    std::printf("[ mxfp8 tiles ] %-12s n=%5d %s: compared %d, vs cpu mxfp8 %.2e (%.1f%% of tokens < 1e-4), vs cpu float32 "
                "%.2e\n", k.s.name, k.n, path, r.compared, r.rel8, 100 * r.exact, r.rel32);
    EXPECT_TRUE(r.finite) << k.s.name << " n=" << k.n;
    EXPECT_GT(r.compared, 0) << k.s.name << " n=" << k.n;
    EXPECT_LT(r.rel8, 1.5e-2) << k.s.name << " n=" << k.n;
    EXPECT_GE(r.exact, 0.25) << k.s.name << " n=" << k.n;
    EXPECT_GT(r.rel32, 4 * r.rel8) << k.s.name << " n=" << k.n << ": the output is not told apart from float32 activations";
  }
}

// Restores the process's decode kernel variant when a test that switches it ends (a failed ASSERT included).
struct VariantGuard {
  DecVariant saved = k3::cuda::moe_decode_variant();
  VariantGuard() = default;
  VariantGuard(const VariantGuard&) = delete;
  VariantGuard& operator=(const VariantGuard&) = delete;
  ~VariantGuard() { k3::cuda::moe_decode_set_variant(saved); }
};

// One routed batch on the device: n tokens of random x, routed by moe_route from random logits; run() calls
// moe_experts on it and returns the output.
struct ExpertCall {
  Moe& m;
  int n;
  DevBuf dx, dl, db, di, dwt, dout;
  k3::cuda::MoeWorkspace ws;

  ExpertCall(Moe& moe, int n_, uint64_t seed)
      : m(moe), n(n_), dx(static_cast<size_t>(n_) * moe.sh.X * 4), dl(static_cast<size_t>(n_) * moe.sh.E * 4),
        db(static_cast<size_t>(moe.sh.E) * 4), di(static_cast<size_t>(n_) * moe.sh.K * 4),
        dwt(static_cast<size_t>(n_) * moe.sh.K * 4), dout(static_cast<size_t>(n_) * moe.sh.X * 4),
        ws(n_, moe.sh.K, moe.sh.E, moe.sh.I, moe.sh.X) {
    Rng rng(seed);
    std::vector<float> x(static_cast<size_t>(n) * m.sh.X), logits(static_cast<size_t>(n) * m.sh.E);
    for (auto& v : x) v = m.x_std * rng.normal();
    for (auto& v : logits) v = 1.5f * rng.normal();
    ck(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "x");
    ck(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "logits");
    ck(cudaMemcpy(db.p, m.bias.data(), m.bias.size() * 4, cudaMemcpyHostToDevice), "bias");
    ck(k3::cuda::moe_route(n, m.sh.E, m.sh.K, dl.as<float>(), db.as<float>(), true, 2.5f, di.as<int32_t>(),
                           dwt.as<float>(), nullptr),
       "moe_route");
  }

  std::vector<float> run(MoePrecision prec, MoePath path) {
    const size_t count = static_cast<size_t>(n) * m.sh.X;
    ck(cudaMemset(dout.p, 0xff, count * 4), "poison out");  // NaN: a missed write shows
    ck(k3::cuda::moe_experts(m.bank, n, m.sh.K, dx.as<float>(), di.as<int32_t>(), dwt.as<float>(),
                             m.sh.mx ? GluAct::SiTU : GluAct::SiLU, 4.f, 25.f, dout.as<float>(), ws, nullptr, prec, path),
       "moe_experts");
    ck(cudaDeviceSynchronize(), "sync");
    std::vector<float> out(count);
    ck(cudaMemcpy(out.data(), dout.p, count * 4, cudaMemcpyDeviceToHost), "out");
    return out;
  }
};

const char* variant_name(DecVariant v) {
  return v == DecVariant::Ring ? "ring" : v == DecVariant::Ring4 ? "ring4" : "reg";
}

// The MXFP4 decode kernel's ring variants (moe_decode.h DecVariant) give dec_kernel's bits exactly: same
// chunks in the same order per accumulator, same K split. Wide scales (kK3: the two-multiply path past 2^127 in
// nearly every chunk) and QAT scales (kK3Qat: one multiply), both precisions, n = 1 / 8 / 64 (8-pair tiles at
// E = 896) and 128 (16-pair tiles); the tiny shapes add columns past the last whole chunk (X = I = 96) and rows
// past the last whole block. Forced TcDecode, no CPU reference (the tests above hold dec_kernel to it).
TEST(CudaMoe, DecodeVariantsBitwise) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  VariantGuard guard;
  for (const Shape& s : {tiny_shapes()[2], tiny_shapes()[5], kK3, kK3Qat}) {
    Moe& m = cached_moe(s);
    for (int n : {1, 8, 64, 128}) {
      ExpertCall call(m, n, 500 + n);
      for (MoePrecision prec : {MoePrecision::Bf16x2, MoePrecision::Bf16}) {
        k3::cuda::moe_decode_set_variant(DecVariant::Reg);
        const std::vector<float> ref = call.run(prec, MoePath::TcDecode);
        const size_t nans = std::count_if(ref.begin(), ref.end(), [](float v) { return std::isnan(v); });
        EXPECT_EQ(nans, 0u) << s.name << " n=" << n;  // NaN == NaN bitwise would hide a missed write
        for (DecVariant v : {DecVariant::Ring, DecVariant::Ring4}) {
          k3::cuda::moe_decode_set_variant(v);
          const std::vector<float> out = call.run(prec, MoePath::TcDecode);
          size_t diff = 0;
          for (size_t i = 0; i < out.size(); ++i) diff += std::memcmp(&out[i], &ref[i], 4) != 0;
          const char* pn = prec == MoePrecision::Bf16 ? "bf16" : "bf16x2";
          std::printf("[ moe ] %-12s n=%4d %-6s %-5s vs reg: %zu of %zu floats differ\n", s.name, n, pn,
                      variant_name(v), diff, out.size());
          EXPECT_EQ(std::memcmp(out.data(), ref.data(), out.size() * 4), 0)
              << s.name << " n=" << n << " " << pn << " " << variant_name(v) << ": " << diff << " floats differ";
        }
      }
    }
  }
}

// The folded launches (moe_decode.h moe_dec_fold_enabled: x converted while the gate/up kernel stages it, the GLU
// applied while the down kernel stages h) give the separate launches' bits exactly: the same conversion, the same
// split sums in the same order, the same GLU. bf16 (SiLU, I = 200 and 48: partial last chunks) and MXFP4 (SiTU: the
// GLU's betas reach the down kernel) shapes, QAT-scaled K3, both precisions, the register and ring kernels, n = 1 / 8
// / 64 (8-pair tiles) and 128 (16-pair tiles at K3's E). A fold that staged from the wrong split, slot or column, or
// dropped a beta, moves bits. Both sides of the GLU rule are run: the tiny shapes' small batches fold the GLU, K3's and
// the larger batches keep its launch (checked, so that a rule that never folded could not pass as "the same bits").
TEST(CudaMoe, DecodeFoldGivesTheSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  VariantGuard guard;
  struct FoldGuard {
    ~FoldGuard() { k3::cuda::force_moe_dec_fold_for_testing(std::nullopt); }
  } fold_guard;
  k3::cuda::force_moe_dec_fold_for_testing(true);
  EXPECT_TRUE(k3::cuda::moe_dec_folds_glu(tiny_shapes()[0].K, tiny_shapes()[0].I, tiny_shapes()[0].X));
  EXPECT_FALSE(k3::cuda::moe_dec_folds_glu(kK3Qat.K, kK3Qat.I, kK3Qat.X));  // 688k GLUs at one token
  EXPECT_FALSE(k3::cuda::moe_dec_folds_glu(128 * tiny_shapes()[6].K, tiny_shapes()[6].I, tiny_shapes()[6].X));
  for (const Shape& s : {tiny_shapes()[0], tiny_shapes()[2], tiny_shapes()[6], kK3Qat}) {
    Moe& m = cached_moe(s);
    for (int n : {1, 8, 64, 128}) {
      ExpertCall call(m, n, 900 + n);
      for (MoePrecision prec : {MoePrecision::Bf16x2, MoePrecision::Bf16})
        for (DecVariant v : {DecVariant::Reg, DecVariant::Ring}) {
          if (v == DecVariant::Ring && !s.mx) continue;  // bf16 experts always take the register kernel
          k3::cuda::moe_decode_set_variant(v);
          k3::cuda::force_moe_dec_fold_for_testing(false);
          const std::vector<float> ref = call.run(prec, MoePath::TcDecode);
          k3::cuda::force_moe_dec_fold_for_testing(true);
          const std::vector<float> out = call.run(prec, MoePath::TcDecode);
          const size_t nans = std::count_if(ref.begin(), ref.end(), [](float x) { return std::isnan(x); });
          EXPECT_EQ(nans, 0u) << s.name << " n=" << n;
          size_t diff = 0;
          for (size_t i = 0; i < out.size(); ++i) diff += std::memcmp(&out[i], &ref[i], 4) != 0;
          const char* pn = prec == MoePrecision::Bf16 ? "bf16" : "bf16x2";
          std::printf("[ moe ] %-12s n=%4d %-6s %-5s folded vs launches: %zu of %zu floats differ\n", s.name, n, pn,
                      variant_name(v), diff, out.size());
          EXPECT_EQ(diff, 0u) << s.name << " n=" << n << " " << pn << " " << variant_name(v);
        }
    }
  }
}

// CUTLASS's Bf16x2 forms (moe_grouped_gemm.h): one launch over both halves' GEMMs (each expert's adjacent), the halves'
// products summed by the GLU and the combine, against two launches with the lo one accumulating in its epilogue --
// the same fp32 sums, so the same bits. BF16 banks (tiny-kl, tiny-bf-160, kl-like: I = 200 edge tiles; kimi-linear's
// true widths), n around the combine's kernel switch and both tile heights. The one-launch form must differ from the
// bf16 result (it did run split). (On devices without sm_90a the path is refused: skipped.)
TEST(CudaMoe, CutlassSplitFormsGiveTheSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Reset {
    ~Reset() {
      k3::cuda::moe_cutlass::set_split_two_launches(false);
      k3::cuda::moe_cutlass::set_tile_m(0);
    }
  } reset;
  for (const Shape& s : {tiny_shapes()[0], tiny_shapes()[3], tiny_shapes()[6], kKimiLinear}) {
    Moe& m = cached_moe(s);
    if (!k3::cuda::moe_cutlass::supports(m.bank)) GTEST_SKIP() << "CUTLASS grouped GEMMs need sm_90a";
    for (int n : {64, 600}) {
      if (s.X > 1024 && n > 64) continue;  // kimi-linear's widths: one size (the CPU side is not involved, but time)
      ExpertCall call(m, n, 1300 + n);
      for (int tile : {64, 128}) {
        k3::cuda::moe_cutlass::set_tile_m(tile);
        k3::cuda::moe_cutlass::set_split_two_launches(true);
        const std::vector<float> two = call.run(MoePrecision::Bf16x2, MoePath::Cutlass);
        k3::cuda::moe_cutlass::set_split_two_launches(false);
        const std::vector<float> one = call.run(MoePrecision::Bf16x2, MoePath::Cutlass);
        const std::vector<float> plain = call.run(MoePrecision::Bf16, MoePath::Cutlass);
        size_t diff = 0, nans = 0, vs_plain = 0;
        for (size_t i = 0; i < one.size(); ++i) {
          diff += std::memcmp(&one[i], &two[i], 4) != 0;
          nans += std::isnan(one[i]) ? 1 : 0;
          vs_plain += std::memcmp(&one[i], &plain[i], 4) != 0;
        }
        std::printf("[ moe ] %-12s n=%4d tile %3d cutlass bf16x2 one launch vs two: %zu of %zu floats differ (vs bf16: %zu)\n",
                    s.name, n, tile, diff, one.size(), vs_plain);
        EXPECT_EQ(nans, 0u) << s.name << " n=" << n;
        EXPECT_EQ(diff, 0u) << s.name << " n=" << n << " tile " << tile;
        EXPECT_GT(vs_plain, 0u) << s.name << " n=" << n << ": the split form gave the bf16 bits";
      }
    }
  }
}

// The ring form (sm90a/moe_prefill_ring.cu) against the shared-memory wgmma form on the same call, at both precisions.
// The two sum a chunk's products in different k orders, so they agree to rounding, not bitwise: at bf16x2 both carry
// the activations to ~2^-17; at bf16 a GLU output on either side of a bf16 rounding boundary moves the down products by
// up to 2^-8 of one term. (The CPU reference checks both forms at small n in run_checks.)
void expect_ring_matches_shared_form(const std::vector<std::pair<Shape, int>>& cases, uint64_t seed, const char* what) {
  for (const auto& [s, n] : cases) {
    Moe& m = cached_moe(s);
    if (!k3::cuda::moe_wg::ring_supports(m.bank)) GTEST_SKIP() << "the ring form needs sm_90a";
    ExpertCall call(m, n, seed + n);
    for (MoePrecision prec : {MoePrecision::Bf16x2, MoePrecision::Bf16}) {
      const std::vector<float> ref = call.run(prec, MoePath::Wgmma);
      const std::vector<float> out = call.run(prec, MoePath::WgmmaRing);
      double maxref = 0, maxdiff = 0;
      size_t nans = 0, diff = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        nans += std::isnan(out[i]) || std::isnan(ref[i]) ? 1 : 0;
        maxref = std::max(maxref, std::fabs(static_cast<double>(ref[i])));
        maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(out[i]) - ref[i]));
        diff += out[i] != ref[i] ? 1 : 0;
      }
      const double rel = maxdiff / maxref, tol = prec == MoePrecision::Bf16x2 ? 1e-5 : 2e-3;
      const char* pn = prec == MoePrecision::Bf16 ? "bf16" : "bf16x2";
      std::printf("[ moe ] %-12s n=%4d %-6s ring vs shared-memory wgmma%s: max rel %.2e (%zu of %zu floats differ)\n",
                  s.name, n, pn, what, rel, diff, out.size());
      EXPECT_EQ(nans, 0u) << s.name << " n=" << n << " " << pn;
      EXPECT_GT(maxref, 0.0) << s.name;
      EXPECT_LT(rel, tol) << s.name << " n=" << n << " " << pn;
    }
  }
}

// At prefill sizes, where the widest tiles and every stage of the ring run (the CPU reference is too slow there):
// k3-like at n = 1024 (128 pairs an expert: full 128-pair tiles), K3's QAT bank at n = 4096 (~73 pairs an expert:
// mostly the n80 and n96 tiles).
TEST(CudaMoe, RingMatchesSharedFormAtPrefillSizes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_ring_matches_shared_form({{tiny_shapes()[5], 1024}, {kK3Qat, 4096}}, 1500, "");
}

// On small shapes, cheap enough for compute-sanitizer's racecheck / synccheck (the ring's stages are refilled while
// other warps may still read them; the path table's runs take too long under the tools): tiny-k3 at n = 257 (64 pairs
// an expert: n64 tiles; X = 128, I = 64: the ring shorter than its depth) and k3-like at n = 130 (16 chunks of X, 8 of
// I: every stage refilled).
TEST(CudaMoe, RingMatchesSharedFormSmall) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_ring_matches_shared_form({{tiny_shapes()[1], 257}, {tiny_shapes()[5], 130}}, 1700, " (small)");
}

// The ring's narrow-scale decode (banks whose scales are all <= 2^1, as trained weights have; session 64) against its
// general decode on the same QAT-scale banks: the same products in the same order, so the same bits. Also that the
// banks are narrow as counted, that a bank with a scale of 2^2 is not, and -- so that the bitwise check cannot pass by
// comparing the general decode with itself -- that the narrow decode does run: on that wide bank, with its count
// overstated as narrow, it must give other bits (its one multiply overflows past 2^1).
TEST(CudaMoe, RingNarrowScalesMatchGeneralBitwise) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  {
    Moe& wide = cached_moe(tiny_shapes()[5]);
    EXPECT_GT(wide.bank.max_scale, 128) << "k3-like's scales reach 2^2";
    if (!k3::cuda::moe_wg::ring_supports(wide.bank)) GTEST_SKIP() << "the ring form needs sm_90a";
    ExpertCall call(wide, 130, 1890);
    const std::vector<float> honest = call.run(MoePrecision::Bf16x2, MoePath::WgmmaRing);
    const uint8_t counted = wide.bank.max_scale;
    wide.bank.max_scale = 128;  // a lie: the narrow decode on scales up to 2^2
    const std::vector<float> lied = call.run(MoePrecision::Bf16x2, MoePath::WgmmaRing);
    wide.bank.max_scale = counted;
    size_t diff = 0;
    for (size_t i = 0; i < honest.size(); ++i) diff += std::memcmp(&honest[i], &lied[i], 4) != 0;
    std::printf("[ moe ] %-12s n= 130 ring narrow decode forced on a 2^2-scale bank: %zu of %zu floats differ\n",
                wide.sh.name, diff, honest.size());
    EXPECT_GT(diff, 0u) << "the narrow decode did not run (or gave the general decode's bits past 2^1)";
  }
  const Shape k3_like_qat{128, 16, 1024, 512, true, "k3-like-qat", true};
  for (const auto& [s, n] : std::vector<std::pair<Shape, int>>{{k3_like_qat, 130}, {k3_like_qat, 1024}, {kK3Qat, 4096}}) {
    Moe& m = cached_moe(s);
    if (!k3::cuda::moe_wg::ring_supports(m.bank)) GTEST_SKIP() << "the ring form needs sm_90a";
    ASSERT_LE(m.bank.max_scale, 128) << s.name;
    ExpertCall call(m, n, 1900 + n);
    for (MoePrecision prec : {MoePrecision::Bf16x2, MoePrecision::Bf16}) {
      const std::vector<float> narrow = call.run(prec, MoePath::WgmmaRing);
      k3::cuda::moe_wg::force_ring_narrow_scales_for_testing(false);
      const std::vector<float> general = call.run(prec, MoePath::WgmmaRing);
      k3::cuda::moe_wg::force_ring_narrow_scales_for_testing(std::nullopt);
      size_t diff = 0, nonzero = 0;
      for (size_t i = 0; i < narrow.size(); ++i) {
        diff += std::memcmp(&narrow[i], &general[i], 4) != 0;
        nonzero += narrow[i] != 0.f && !std::isnan(narrow[i]);
      }
      const char* pn = prec == MoePrecision::Bf16 ? "bf16" : "bf16x2";
      std::printf("[ moe ] %-12s n=%4d %-6s ring narrow-scale decode vs general: %zu of %zu floats differ (%zu non-zero)\n",
                  s.name, n, pn, diff, narrow.size(), nonzero);
      EXPECT_EQ(diff, 0u) << s.name << " n=" << n << " " << pn;
      EXPECT_GT(nonzero, narrow.size() / 2) << s.name << " n=" << n << " " << pn;
    }
  }
}

// Equal logits and no bias: every score ties, so the picks must be experts 0..K-1 in order.
TEST(CudaMoe, RouteTiesToLowerId) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::RouteForm;
  const int n = 5, K = 6;
  for (const int E : {40, 896})
    for (const RouteForm form : {RouteForm::Warp, RouteForm::Block, RouteForm::Scan}) {
      std::vector<float> logits(static_cast<size_t>(n) * E, 0.3f);
      DevBuf dl(logits.size() * 4), di(n * K * 4), dw(n * K * 4);
      ck(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "logits");
      ck(k3::cuda::moe_route(n, E, K, dl.as<float>(), nullptr, true, 1.0f, di.as<int32_t>(), dw.as<float>(), nullptr, form),
         "route");
      std::vector<int> ids(n * K);
      std::vector<float> w(n * K);
      ck(cudaMemcpy(ids.data(), di.p, ids.size() * 4, cudaMemcpyDeviceToHost), "ids");
      ck(cudaMemcpy(w.data(), dw.p, w.size() * 4, cudaMemcpyDeviceToHost), "w");
      for (int t = 0; t < n; ++t)
        for (int k = 0; k < K; ++k) {
          EXPECT_EQ(ids[t * K + k], k) << "E=" << E << " form " << static_cast<int>(form);
          EXPECT_NEAR(w[t * K + k], 1.0f / K, 1e-6f);
        }
    }
}

// The warp and block routing kernels (E <= 256 and E <= 1024, one and four warps a token) against the rule on the host: higher biased score first, then
// the lower id; a NaN score after every number. Logits on a coarse grid (many exact ties, distinct levels far apart
// against an ulp of expf), biases in 1/64 steps, +-inf logits, a row of NaNs among numbers and an all-NaN row:
// the picks exactly, the weights within 1e-6.
TEST(CudaMoe, RouteWarpPicksFollowTheRule) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::RouteForm;
  for (const RouteForm form : {RouteForm::Warp, RouteForm::Block})
  for (const int E : {40, 256, 896, 1000}) {
    Rng rng(77 + E);
    for (const int K : {1, 6, 16, 32}) {
      if (K > E) continue;
      SCOPED_TRACE(form == RouteForm::Warp ? "warp form" : "block form");
      const int n = 9;
      std::vector<float> logits(static_cast<size_t>(n) * E), bias(E);
      for (auto& v : logits) v = 0.25f * static_cast<float>(static_cast<int>(rng.normal() * 6.0f));
      for (auto& v : bias) v = static_cast<float>(static_cast<int>(rng.normal() * 4.0f)) / 64.0f;
      logits[1 * E + 3] = INFINITY;
      logits[1 * E + E - 1] = INFINITY;  // ties with expert 3 at sigmoid 1 (bias decides)
      logits[2 * E + 0] = -INFINITY;
      for (int e = 0; e < E; e += 3) logits[3 * E + e] = NAN;  // NaNs among numbers
      for (int e = 0; e < E; ++e) logits[4 * E + e] = NAN;     // all NaN
      DevBuf dl(logits.size() * 4), db(bias.size() * 4), di(n * K * 4), dw(n * K * 4);
      ck(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "logits");
      ck(cudaMemcpy(db.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), "bias");
      ck(k3::cuda::moe_route(n, E, K, dl.as<float>(), db.as<float>(), true, 2.5f, di.as<int32_t>(), dw.as<float>(), nullptr,
                             form),
         "route");
      std::vector<int> ids(n * K);
      std::vector<float> w(n * K);
      ck(cudaMemcpy(ids.data(), di.p, ids.size() * 4, cudaMemcpyDeviceToHost), "ids");
      ck(cudaMemcpy(w.data(), dw.p, w.size() * 4, cudaMemcpyDeviceToHost), "w");
      for (int t = 0; t < n; ++t) {
        std::vector<float> sig(E), biased(E);
        for (int e = 0; e < E; ++e) {
          sig[e] = 1.0f / (1.0f + std::exp(-logits[static_cast<size_t>(t) * E + e]));
          biased[e] = sig[e] + bias[e];
        }
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
          if (std::isnan(biased[a]) || std::isnan(biased[b])) return !std::isnan(biased[a]) && std::isnan(biased[b]);
          return biased[a] > biased[b];
        });
        double denom = 0;
        for (int k = 0; k < K; ++k) denom += std::isnan(sig[order[k]]) ? 0.0 : sig[order[k]];
        std::set<int> seen;
        for (int k = 0; k < K; ++k) {
          const int got = ids[t * K + k];
          ASSERT_TRUE(got >= 0 && got < E) << "E=" << E << " K=" << K << " t=" << t;
          EXPECT_TRUE(seen.insert(got).second) << "repeated id " << got << " E=" << E << " K=" << K << " t=" << t;
          if (t == 4) continue;  // all NaN: any valid, distinct ids
          EXPECT_EQ(got, order[k]) << "E=" << E << " K=" << K << " t=" << t << " rank " << k;
          if (t != 3) {
            EXPECT_NEAR(w[t * K + k], sig[order[k]] / denom * 2.5, 1e-6 * 2.5) << "E=" << E << " K=" << K << " t=" << t;
          }
        }
      }
    }
  }
}

// The shared expert fused into the GEMV path's kernels (moe_experts_with_shared): out = the routed experts (the
// unfused GEMV path, checked against the CPU above) + the shared GLU MLP computed on the host, within 1e-5 of the
// largest output; every element written (NaN-poisoned out); an invalid id in a slot adds nothing; SiLU and SiTU;
// moe_shared_fusable refuses a batch past the GEMV path, a shape that differs, MXFP4 experts.
// Timing (prints only): the router's top-K at decode sizes (Kimi-Linear E = 256, K = 8; K3 E = 896, K = 16), 200
// launches captured in one CUDA graph (the decode step's form: launch latency mostly hidden) and, for scale, the same
// graph of a 4-byte cudaMemsetAsync node. Call s44-2's ncu step split had the one-token route at 9.1 us a layer
// (Kimi-Linear), the cost of a 5 MB GEMV; this says what the kernel itself takes.
TEST(CudaMoe, RouteTiming) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Rng rng(5);
  cudaStream_t s;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  auto graph_us = [&](const std::function<void()>& body) {  // us per captured launch, best of 3 replays
    constexpr int kLaunches = 200;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < kLaunches; ++i) body();
    ck(cudaStreamEndCapture(s, &g), "end capture");
    ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    cudaEvent_t a, b;
    ck(cudaEventCreate(&a), "event");
    ck(cudaEventCreate(&b), "event");
    float best = 1e30f;
    for (int r = 0; r < 4; ++r) {  // the first replay warms up
      ck(cudaEventRecord(a, s), "record");
      ck(cudaGraphLaunch(ge, s), "launch");
      ck(cudaEventRecord(b, s), "record");
      ck(cudaEventSynchronize(b), "sync");
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
      if (r > 0) best = std::min(best, ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return 1e3 * best / kLaunches;
  };
  DevBuf one(4);
  const double memset_us = graph_us([&] { ck(cudaMemsetAsync(one.p, 0, 4, s), "memset"); });
  std::printf("[ timing ] graph of 4-byte memsets: %.2f us a node\n", memset_us);
  for (const auto& [E, K] : {std::pair{256, 8}, std::pair{896, 16}}) {
    for (const int n : {1, 8, 64}) {
      std::vector<float> logits(static_cast<size_t>(n) * E), bias(E);
      for (auto& v : logits) v = rng.normal();
      for (auto& v : bias) v = 0.01f * rng.normal();
      DevBuf dl(logits.size() * 4), db(bias.size() * 4), di(static_cast<size_t>(n) * K * 4), dw(static_cast<size_t>(n) * K * 4);
      ck(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "logits");
      ck(cudaMemcpy(db.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), "bias");
      using k3::cuda::RouteForm;
      for (const auto& [form, name] : {std::pair{RouteForm::Auto, "rule"}, std::pair{RouteForm::Warp, "warp"},
                                       std::pair{RouteForm::Block, "block"}, std::pair{RouteForm::Scan, "scan"}}) {
        const double us = graph_us([&] {
          ck(k3::cuda::moe_route(n, E, K, dl.as<float>(), db.as<float>(), true, 2.5f, di.as<int32_t>(), dw.as<float>(), s,
                                 form),
             "route");
        });
        std::printf("[ timing ] moe_route E=%d K=%d n=%d %-5s: %.2f us a launch in a graph\n", E, K, n, name, us);
      }
    }
  }
  ck(cudaStreamDestroy(s), "stream");
}

TEST(CudaMoe, SharedExpertFusedIntoGemvPath) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::GluAct;
  for (const Shape& s : {tiny_shapes()[3], tiny_shapes()[6], kKimiLinear}) {
    Moe& m = cached_moe(s);
    const int E = s.E, K = s.K, X = s.X, I = s.I, max_tokens = 8;
    k3::cuda::MoeWorkspace ws(max_tokens, K, E, I, X);
    Rng rng(900 + E);
    std::vector<uint16_t> sg(static_cast<size_t>(I) * X), su(sg.size()), sd(static_cast<size_t>(X) * I);
    for (auto* v : {&sg, &su, &sd})
      for (auto& b : *v) b = k3::f32_to_bf16(0.02f * rng.normal());
    DevBuf dsg(sg.size() * 2), dsu(su.size() * 2), dsd(sd.size() * 2);
    ck(cudaMemcpy(dsg.p, sg.data(), sg.size() * 2, cudaMemcpyHostToDevice), "sg");
    ck(cudaMemcpy(dsu.p, su.data(), su.size() * 2, cudaMemcpyHostToDevice), "su");
    ck(cudaMemcpy(dsd.p, sd.data(), sd.size() * 2, cudaMemcpyHostToDevice), "sd");
    const k3::WeightMatrix hg{k3::WeightFormat::BF16, sg.data(), nullptr, I, X}, hu{k3::WeightFormat::BF16, su.data(), nullptr, I, X},
        hd{k3::WeightFormat::BF16, sd.data(), nullptr, X, I};
    for (const int n : {1, 2, 4}) {
      const bool fusable = k3::cuda::moe_shared_fusable(m.bank, I, X, X, I, n, ws);
      EXPECT_EQ(fusable, static_cast<int64_t>(n) * K * 8 <= E) << s.name << " n=" << n;  // the GEMV path's rule
      if (!fusable) continue;
      for (const GluAct act : {GluAct::SiLU, GluAct::SiTU}) {
        if (act == GluAct::SiTU && n != 1) continue;
        std::vector<float> x(static_cast<size_t>(n) * X);
        for (auto& v : x) v = m.x_std * rng.normal();
        std::vector<int> ids(static_cast<size_t>(n) * K);
        std::vector<float> w(ids.size());
        for (int t = 0; t < n; ++t)
          for (int k = 0; k < K; ++k) {
            ids[t * K + k] = (t * 7 + k * 5) % E;  // distinct within a token (K <= E / 8, steps of 5 mod E)
            w[t * K + k] = 0.1f + 0.05f * k;
          }
        ids[K - 1] = -1;  // an invalid slot on token 0: adds nothing
        DevBuf dx(x.size() * 4), di(ids.size() * 4), dw(w.size() * 4), dref(x.size() * 4), dout(x.size() * 4);
        ck(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "x");
        ck(cudaMemcpy(di.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "ids");
        ck(cudaMemcpy(dw.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice), "w");
        ck(cudaMemset(dout.p, 0xff, x.size() * 4), "poison out");
        ck(k3::cuda::moe_experts(m.bank, n, K, dx.as<float>(), di.as<int32_t>(), dw.as<float>(), act, 4.f, 25.f,
                                 dref.as<float>(), ws, nullptr, k3::cuda::MoePrecision::Bf16x2, k3::cuda::MoePath::Gemv),
           "routed");
        ck(k3::cuda::moe_experts_with_shared(m.bank, dsg.p, dsu.p, dsd.p, n, K, dx.as<float>(), di.as<int32_t>(),
                                             dw.as<float>(), act, 4.f, 25.f, dout.as<float>(), ws, nullptr),
           "fused");
        std::vector<float> routed(x.size()), got(x.size());
        ck(cudaMemcpy(routed.data(), dref.p, routed.size() * 4, cudaMemcpyDeviceToHost), "routed");
        ck(cudaMemcpy(got.data(), dout.p, got.size() * 4, cudaMemcpyDeviceToHost), "got");
        std::vector<float> ref(x.size()), gg(I), uu(I), sh(X);
        for (int t = 0; t < n; ++t) {
          k3::cpu::matmul(hg, x.data() + t * X, 1, gg.data());
          k3::cpu::matmul(hu, x.data() + t * X, 1, uu.data());
          if (act == GluAct::SiLU) k3::cpu::silu_glu(gg.data(), uu.data(), I, gg.data());
          else k3::cpu::situ_glu(gg.data(), uu.data(), I, 4.f, 25.f, gg.data());
          k3::cpu::matmul(hd, gg.data(), 1, sh.data());
          for (int r = 0; r < X; ++r) ref[t * X + r] = routed[t * X + r] + sh[r];
        }
        double maxref = 0, maxdiff = 0, maxsh = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          maxref = std::max(maxref, std::fabs(static_cast<double>(ref[i])));
          maxsh = std::max(maxsh, std::fabs(static_cast<double>(ref[i] - routed[i])));
          maxdiff = std::max(maxdiff, std::isfinite(got[i]) ? std::fabs(static_cast<double>(got[i]) - ref[i]) : INFINITY);
        }
        EXPECT_GT(maxsh, 1e-3 * maxref) << s.name << ": the shared expert must matter for the check to mean anything";
        EXPECT_LT(maxdiff / maxref, 1e-5) << s.name << " n=" << n << (act == GluAct::SiLU ? " silu" : " situ");
      }
    }
    EXPECT_FALSE(k3::cuda::moe_shared_fusable(m.bank, I + 8, X, X, I + 8, 1, ws)) << s.name;  // shapes differ
  }
  Moe& mx = cached_moe(tiny_shapes()[1]);  // MXFP4 experts: not this path
  k3::cuda::MoeWorkspace ws(8, mx.sh.K, mx.sh.E, mx.sh.I, mx.sh.X);
  EXPECT_FALSE(k3::cuda::moe_shared_fusable(mx.bank, mx.sh.I, mx.sh.X, mx.sh.X, mx.sh.I, 1, ws));
}

// The bf16 GEMV path's forms give the same bits: h stored permuted (moe_gemv.cu h_perm: the down kernel's activation
// loads contiguous) or in column order, and the down kernel as (row, k) items or as a warp per 4 rows of one pair's
// expert with a separate combine: the same values meet the same weights in the same order, the same rank-order
// combine. I = 1024 (Kimi-Linear), 768 and 1280 (the last batch of chunks partly past the row: the clamped addresses), 200 (not whole 256-chunks: column
// order only); with and without the fused shared expert (its h rows permuted too), n = 1, 2, 4. (bf16 X is a multiple
// of 8, so a 4-row warp never passes X.)
TEST(CudaMoe, GemvDownFormsGiveTheSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::MoeDownForm;
  struct Reset {
    ~Reset() {
      k3::cuda::force_moe_h_perm_for_testing(std::nullopt);
      k3::cuda::force_moe_down_form_for_testing(std::nullopt);
    }
  } reset;
  const Shape shapes[] = {kKimiLinear, {32, 4, 256, 768, false, "bf-768"}, {24, 3, 160, 1280, false, "bf-1280"},
                          {64, 8, 512, 200, false, "bf-200"}};
  struct Form {
    MoeDownForm down;
    bool perm;
    const char* name;
  };
  const Form forms[] = {{MoeDownForm::Items, true, "items+perm"}, {MoeDownForm::Pairs, true, "pairs+perm"},
                        {MoeDownForm::Pairs, false, "pairs"}};
  for (const Shape& s : shapes) {
    Moe& m = cached_moe(s);
    Rng rng(77 + s.I);
    std::vector<uint16_t> sw(static_cast<size_t>(s.I) * s.X * 3);
    for (auto& b : sw) b = k3::f32_to_bf16(0.02f * rng.normal());
    DevBuf dsw(sw.size() * 2);
    ck(cudaMemcpy(dsw.p, sw.data(), sw.size() * 2, cudaMemcpyHostToDevice), "shared");
    const uint16_t* sg = dsw.as<uint16_t>();
    const size_t mat = static_cast<size_t>(s.I) * s.X;
    k3::cuda::MoeWorkspace ws(8, s.K, s.E, s.I, s.X);  // room for the shared expert's pairs (moe_shared_fusable)
    for (const int n : {1, 2, 4}) {
      ExpertCall call(m, n, 800 + n);
      for (const bool shared : {false, true}) {
        if (shared && !k3::cuda::moe_shared_fusable(m.bank, s.I, s.X, s.X, s.I, n, ws)) continue;
        auto run = [&](MoeDownForm down, bool perm) {
          k3::cuda::force_moe_down_form_for_testing(down);
          k3::cuda::force_moe_h_perm_for_testing(perm);
          const size_t count = static_cast<size_t>(n) * s.X;
          ck(cudaMemset(call.dout.p, 0xff, count * 4), "poison out");
          if (shared)
            ck(k3::cuda::moe_experts_with_shared(m.bank, sg, sg + mat, sg + 2 * mat, n, s.K, call.dx.as<float>(),
                                                 call.di.as<int32_t>(), call.dwt.as<float>(), GluAct::SiLU, 4.f, 25.f,
                                                 call.dout.as<float>(), ws, nullptr),
               "fused");
          else
            ck(k3::cuda::moe_experts(m.bank, n, s.K, call.dx.as<float>(), call.di.as<int32_t>(), call.dwt.as<float>(),
                                     GluAct::SiLU, 4.f, 25.f, call.dout.as<float>(), ws, nullptr,
                                     MoePrecision::Bf16x2, MoePath::Gemv),
               "routed");
          ck(cudaDeviceSynchronize(), "sync");
          std::vector<float> out(count);
          ck(cudaMemcpy(out.data(), call.dout.p, count * 4, cudaMemcpyDeviceToHost), "out");
          return out;
        };
        const std::vector<float> ref = run(MoeDownForm::Items, false);
        const size_t nans = std::count_if(ref.begin(), ref.end(), [](float v) { return std::isnan(v); });
        double maxabs = 0;
        for (float v : ref) maxabs = std::max(maxabs, std::fabs(static_cast<double>(v)));
        EXPECT_EQ(nans, 0u) << s.name << " n=" << n;  // NaN == NaN bitwise would hide a missed write
        EXPECT_GT(maxabs, 1e-6) << s.name << ": outputs must not be zeros";
        for (const Form& f : forms) {
          const std::vector<float> got = run(f.down, f.perm);
          size_t diff = 0;
          for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &ref[i], 4) != 0;
          EXPECT_EQ(diff, 0u) << s.name << " n=" << n << (shared ? " +shared " : " ") << f.name << ": floats differ";
          std::printf("[ moe ] down %-10s vs items: %-9s n=%d %-7s %zu of %zu floats differ\n", f.name, s.name, n,
                      shared ? "+shared" : "", diff, got.size());
        }
      }
    }
  }
}

// The MXFP4 GEMV path's down kernel as (8 rows, every k) blocks or pair-major quads with a combine launch
// (moe_gemv.cu gemv_down_mx_pairs_kernel): the same bits. k3-tiny's and K3's shapes (I = 96: a quad lane's last batch
// partly past the row), n = 1, 2, 3.
TEST(CudaMoe, GemvMxDownFormsGiveTheSameBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using k3::cuda::MoeDownForm;
  struct Reset {
    ~Reset() { k3::cuda::force_moe_down_form_for_testing(std::nullopt); }
  } reset;
  for (const Shape& s : {tiny_shapes()[4], tiny_shapes()[5], kK3Qat}) {
    Moe& m = cached_moe(s);
    for (const int n : {1, 2, 3}) {
      ExpertCall call(m, n, 900 + n);
      k3::cuda::force_moe_down_form_for_testing(MoeDownForm::Items);
      const std::vector<float> ref = call.run(MoePrecision::Bf16x2, MoePath::Gemv);
      k3::cuda::force_moe_down_form_for_testing(MoeDownForm::Pairs);
      const std::vector<float> got = call.run(MoePrecision::Bf16x2, MoePath::Gemv);
      const size_t nans = std::count_if(ref.begin(), ref.end(), [](float v) { return std::isnan(v); });
      double maxabs = 0;
      size_t diff = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        maxabs = std::max(maxabs, std::fabs(static_cast<double>(ref[i])));
        diff += std::memcmp(&got[i], &ref[i], 4) != 0;
      }
      EXPECT_EQ(nans, 0u) << s.name << " n=" << n;
      EXPECT_GT(maxabs, 1e-6) << s.name << ": outputs must not be zeros";
      EXPECT_EQ(diff, 0u) << s.name << " n=" << n << ": floats differ";
      std::printf("[ moe ] mx down pairs vs items: %-10s n=%d %zu of %zu floats differ\n", s.name, n, diff, got.size());
    }
  }
}

// Invalid expert ids are dropped, not read out of bounds, on every path that runs on m's bank: token 0 routes everything
// to one expert (one tile with K pairs of the same expert), token 1 has only invalid ids (output exactly 0), token 2
// mixes valid and invalid ids.
void check_invalid_ids(Moe& m) {
  const int E = m.sh.E, K = m.sh.K, X = m.sh.X, I = m.sh.I;
  const int n = 3;
  k3::cuda::MoeWorkspace ws(4, K, E, I, X);
  DevBuf dx(8 * X * 4), di(8 * K * 4), dw(8 * K * 4), dout(8 * X * 4);
  auto experts = [&](int n, int k, const PathCfg& pc) {
    return k3::cuda::moe_experts(m.bank, n, k, dx.as<float>(), di.as<int32_t>(), dw.as<float>(), GluAct::SiLU, 4.f,
                                 25.f, dout.as<float>(), ws, nullptr, pc.prec, pc.path);
  };
  std::vector<float> x(static_cast<size_t>(n) * X);
  Rng rng(5);
  for (auto& v : x) v = m.x_std * rng.normal();
  std::vector<int> ids(n * K);
  std::vector<float> w(n * K, 0.25f);
  for (int k = 0; k < K; ++k) {
    ids[0 * K + k] = 3;
    ids[1 * K + k] = k % 2 ? -1 : E;
    ids[2 * K + k] = k % 2 ? 5 : -7;
  }
  ck(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "x");
  ck(cudaMemcpy(di.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "ids");
  ck(cudaMemcpy(dw.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice), "w");
  // Reference: expert 3 on token 0 (K copies, weight 0.25 each) and expert 5 on token 2 (K/2 copies).
  auto expert_out = [&](int e, const float* xt, std::vector<float>& y) {
    const k3::GluMlp& g = m.w.experts[e];
    std::vector<float> gg(I), uu(I);
    k3::cpu::matmul(g.gate, xt, 1, gg.data());
    k3::cpu::matmul(g.up, xt, 1, uu.data());
    k3::cpu::silu_glu(gg.data(), uu.data(), I, gg.data());
    y.resize(X);
    k3::cpu::matmul(g.down, gg.data(), 1, y.data());
  };
  std::vector<float> y0, y2;
  expert_out(3, x.data(), y0);
  expert_out(5, x.data() + 2 * X, y2);
  for (const PathCfg& pc : kPaths) {
    bool not_bank = false;
    if (path_skipped(pc, m, not_bank)) continue;  // not this bank's or device's (CudaMoe.EdgeCases runs two banks)
    ck(cudaMemset(dout.p, 0xff, static_cast<size_t>(n) * X * 4), "poison out");  // NaN: every element must be written
    if (pc.path == MoePath::Cutlass) k3::cuda::moe_cutlass::set_tile_m(pc.cutlass_tile);  // Auto: the rule
    const cudaError_t ran = experts(n, K, pc);
    k3::cuda::moe_cutlass::set_tile_m(0);
    ASSERT_EQ(ran, cudaSuccess) << pc.name;
    ck(cudaDeviceSynchronize(), "sync");
    std::vector<float> out(static_cast<size_t>(n) * X);
    ck(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost), "out");
    double maxref = 0, maxdiff = 0;
    for (int d = 0; d < X; ++d) {
      const double r0 = 0.25 * K * y0[d], r2 = 0.25 * (K / 2) * y2[d];
      maxref = std::max({maxref, std::fabs(r0), std::fabs(r2)});
      maxdiff = std::max({maxdiff, std::fabs(out[d] - r0), std::fabs(out[2 * X + d] - r2)});
      EXPECT_EQ(out[X + d], 0.0f) << pc.name << " " << d;
      EXPECT_FALSE(std::isnan(out[d]) || std::isnan(out[2 * X + d])) << pc.name << " " << d;
    }
    std::printf("[ moe ] invalid-id edge case %-10s %-14s max_rel %.2e\n", m.sh.name, pc.name, maxdiff / maxref);
    EXPECT_LT(maxdiff / maxref, pc.tol) << pc.name;
  }
}

TEST(CudaMoe, EdgeCases) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Moe& m = cached_moe(tiny_shapes()[1]);
  const int E = m.sh.E, K = m.sh.K, X = m.sh.X, I = m.sh.I;
  const int max_tokens = 4;
  k3::cuda::MoeWorkspace ws(max_tokens, K, E, I, X);
  DevBuf dx(8 * X * 4), di(8 * K * 4), dw(8 * K * 4), dout(8 * X * 4), dl(8 * E * 4);
  auto experts = [&](int n, int k, const PathCfg& pc = kPaths[kAutoPath]) {
    return k3::cuda::moe_experts(m.bank, n, k, dx.as<float>(), di.as<int32_t>(), dw.as<float>(), GluAct::SiLU, 4.f,
                                 25.f, dout.as<float>(), ws, nullptr, pc.prec, pc.path);
  };
  // No tokens: nothing to do, success.
  EXPECT_EQ(experts(0, K), cudaSuccess);
  EXPECT_EQ(k3::cuda::moe_route(0, E, K, dl.as<float>(), nullptr, true, 1.f, di.as<int32_t>(), dw.as<float>(), nullptr),
            cudaSuccess);
  // More tokens than the workspace holds, or a different K: rejected.
  EXPECT_EQ(experts(max_tokens + 1, K), cudaErrorInvalidValue);
  EXPECT_EQ(experts(2, K + 1), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::moe_route(1, E, E + 1, dl.as<float>(), nullptr, true, 1.f, di.as<int32_t>(), dw.as<float>(), nullptr),
            cudaErrorInvalidValue);
  // Bad workspace shapes throw.
  EXPECT_THROW(k3::cuda::MoeWorkspace(4, 33, 64, 64, 64), k3::Error);
  EXPECT_THROW(k3::cuda::MoeWorkspace(4, 2, 8, 64, 60), k3::Error);
  EXPECT_THROW(k3::cuda::MoeWorkspace(0, 2, 8, 64, 64), k3::Error);

  check_invalid_ids(m);
  check_invalid_ids(cached_moe(tiny_shapes()[3]));  // a BF16 bank (tiny-bf-160): where CUTLASS's grouped GEMMs run
  // Bad precision / path values are rejected.
  EXPECT_EQ(k3::cuda::moe_experts(m.bank, 1, K, dx.as<float>(), di.as<int32_t>(), dw.as<float>(), GluAct::SiLU, 4.f,
                                  25.f, dout.as<float>(), ws, nullptr, static_cast<MoePrecision>(7)),
            cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::moe_experts(m.bank, 1, K, dx.as<float>(), di.as<int32_t>(), dw.as<float>(), GluAct::SiLU, 4.f,
                                  25.f, dout.as<float>(), ws, nullptr, MoePrecision::Bf16x2, static_cast<MoePath>(9)),
            cudaErrorInvalidValue);
  // CUTLASS's grouped GEMMs take BF16 banks only: forced on this MXFP4 one, refused.
  EXPECT_EQ(experts(2, K, PathCfg{MoePath::Cutlass, MoePrecision::Bf16x2, 0, "cutlass"}), cudaErrorInvalidValue);
}

// moe_combine's two kernels (a block per token and 128 columns for decode sizes; a block per token with 8 slots' loads
// in flight from kCombineRowsMinTokens tokens) against the host's expression: each slot's partials summed
// in split order from 0, then w * v added in rank order by fma, dropped slots (< 0) skipped -- bit for bit, at
// several n on both sides of the switch, K = 8 (Kimi-Linear), 16 and 3 (a partial group of 8), X not a multiple of
// 512 columns, random slots (some dropped) and weights; moe_combine_bf16 (bf16 partials widened) the same way.
TEST(CudaMoe, CombineKernelsBitwise) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  const int X = 2304 + 40;  // a multiple of 8 (the bf16 kernel), not of 512
  for (const int K : {8, 16, 3})
    for (const int splits : {1, 2})
      for (const int n : {1, 7, k3::cuda::kCombineRowsMinTokens - 1, k3::cuda::kCombineRowsMinTokens, 1500}) {
        const int P = n * K;
        std::vector<float> y(static_cast<size_t>(splits) * P * X), w(static_cast<size_t>(P));
        std::vector<int32_t> slot(static_cast<size_t>(P));
        for (auto& v : y) v = ud(rng);
        for (auto& v : w) v = ud(rng);
        std::vector<int32_t> perm(static_cast<size_t>(P));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int p = 0; p < P; ++p) slot[static_cast<size_t>(p)] = (perm[static_cast<size_t>(p)] % 13 == 5) ? -1 : perm[static_cast<size_t>(p)];
        DevBuf dy(y.size() * 4), dw(w.size() * 4), ds(slot.size() * 4), dout(static_cast<size_t>(n) * X * 4);
        ck(cudaMemcpy(dy.p, y.data(), y.size() * 4, cudaMemcpyHostToDevice), "h2d");
        ck(cudaMemcpy(dw.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice), "h2d");
        ck(cudaMemcpy(ds.p, slot.data(), slot.size() * 4, cudaMemcpyHostToDevice), "h2d");
        ck(cudaMemset(dout.p, 0xff, static_cast<size_t>(n) * X * 4), "poison");
        ASSERT_EQ(k3::cuda::moe_combine(n, X, K, dy.as<float>(), static_cast<int64_t>(P) * X, splits, ds.as<int32_t>(),
                                        dw.as<float>(), dout.as<float>(), nullptr),
                  cudaSuccess);
        std::vector<float> got(static_cast<size_t>(n) * X);
        // Outputs that differ from the host's expression: slot values value(slot, column) added in rank order by fma.
        auto mismatches = [&](auto&& value) {
          ck(cudaMemcpy(got.data(), dout.p, got.size() * 4, cudaMemcpyDeviceToHost), "d2h");
          size_t bad = 0;
          for (int t = 0; t < n; ++t)
            for (int c = 0; c < X; ++c) {
              float acc = 0.f;
              for (int k = 0; k < K; ++k) {
                const int sl = slot[static_cast<size_t>(t) * K + k];
                if (sl >= 0) acc = std::fma(w[static_cast<size_t>(t) * K + k], value(sl, c), acc);
              }
              const float g = got[static_cast<size_t>(t) * X + c];
              if (std::memcmp(&g, &acc, 4) != 0) ++bad;
            }
          return bad;
        };
        EXPECT_EQ(mismatches([&](int sl, int c) {
                    float v = 0.f;
                    for (int sp = 0; sp < splits; ++sp) v += y[(static_cast<size_t>(sp) * P + sl) * X + c];
                    return v;
                  }),
                  0u)
            << "n " << n << " K " << K << " splits " << splits;
        if (splits != 1) continue;
        // moe_combine_bf16: the same partials rounded to bf16 bits, widened exactly, the same sums.
        std::vector<uint16_t> yb(static_cast<size_t>(P) * X);
        for (size_t i = 0; i < yb.size(); ++i) yb[i] = k3::f32_to_bf16(y[i]);
        DevBuf dyb(yb.size() * 2);
        ck(cudaMemcpy(dyb.p, yb.data(), yb.size() * 2, cudaMemcpyHostToDevice), "h2d");
        ck(cudaMemset(dout.p, 0xff, static_cast<size_t>(n) * X * 4), "poison");
        ASSERT_EQ(k3::cuda::moe_combine_bf16(n, X, K, dyb.as<uint16_t>(), ds.as<int32_t>(), dw.as<float>(), dout.as<float>(),
                                             nullptr),
                  cudaSuccess);
        EXPECT_EQ(mismatches([&](int sl, int c) { return 0.f + k3::bf16_to_f32(yb[static_cast<size_t>(sl) * X + c]); }), 0u)
            << "bf16 partials: n " << n << " K " << K;
      }
}

// Timing (prints only): decode batches and a 2048-token prefill on the real shapes, Auto and (n >= 64) each
// forced path; the forced decode path on MXFP4 experts once per DecVariant (reg, then the ring kernels, labelled
// after the path name; Auto runs the process's variant, K3_MOE_DEC_VARIANT). Weight bytes are those of the distinct experts the batch touches; the L2 (50 MB) is flushed
// before each timed call. TFLOP/s counts 2 * 3 * n * K * I * X useful flops (not the split's second MMA).
TEST(CudaMoe, Timing) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DevBuf flush(256u << 20);
  VariantGuard guard;
  // K3_MOE_TIMING_SHAPES: a subset, by name: "qat" (the QAT-scale K3 bank only: one 16 GB bank instead of two,
  // a shorter call), "qat,kl" (and the Kimi-Linear bank); unset: all three.
  const char* only = std::getenv("K3_MOE_TIMING_SHAPES");
  auto wanted = [&](const Shape& s) {
    if (only == nullptr) return true;
    const std::string o = std::string(",") + only + ",";
    const char* key = s.qat_scales ? ",qat," : s.mx ? ",k3," : ",kl,";
    return o.find(key) != std::string::npos;
  };
  for (const Shape& s : {kK3Qat, kK3, kKimiLinear}) {
    if (!wanted(s)) continue;
    Moe& m = cached_moe(s);
    const int E = s.E, K = s.K, X = s.X;
    const int max_n = 4096;  // K3's 4096-token prefill: ~73 pairs per expert (tiles of 64 and ~9)
    k3::cuda::MoeWorkspace ws(max_n, K, E, s.I, X);
    DevBuf dx(static_cast<size_t>(max_n) * X * 4), dl(static_cast<size_t>(max_n) * E * 4), db(E * 4),
        di(static_cast<size_t>(max_n) * K * 4), dwt(static_cast<size_t>(max_n) * K * 4),
        dout(static_cast<size_t>(max_n) * X * 4);
    // K3_MOE_TIMING_BIAS=0: no correction bias. The bank's +-0.05 on sigmoid scores near the top-16 cut (slope ~0.04
    // there) moves an expert's logit by up to ~1.25, ~0.85 sd of the N(0, 1.5) logits: at 4096 tokens 767 of K3's 896
    // experts get pairs, many past 128 (session 64). A trained router's bias aims at balanced loads instead; zero bias
    // with i.i.d. logits is the balanced case (~73 +- 9 pairs an expert at 4096 tokens).
    const char* bias_env = std::getenv("K3_MOE_TIMING_BIAS");
    const std::vector<float> bias = bias_env && bias_env[0] == '0' ? std::vector<float>(E, 0.f) : m.bias;
    ck(cudaMemcpy(db.p, bias.data(), E * 4, cudaMemcpyHostToDevice), "bias");
    cudaStream_t st;
    ck(cudaStreamCreate(&st), "stream");
    cudaEvent_t e0, e1;
    ck(cudaEventCreate(&e0), "ev");
    ck(cudaEventCreate(&e1), "ev");
    const bool wg_ok = k3::cuda::moe_wg::supports(m.bank);
    EXPECT_TRUE(wg_ok || !device_is_cc90()) << s.name << ": the wgmma tiles refused on a compute-capability-9.0 device";
    // K3_MOE_TIMING_N: the batch sizes, a comma list (a profiler run takes one size: "2048"); unset: all nine.
    const char* only_n = std::getenv("K3_MOE_TIMING_N");
    for (int n : {1, 2, 4, 8, 16, 64, 256, 2048, 4096}) {
      if (only_n != nullptr && (std::string(",") + only_n + ",").find("," + std::to_string(n) + ",") == std::string::npos) continue;
      Rng rng(77 + n);
      std::vector<float> x(static_cast<size_t>(n) * X), logits(static_cast<size_t>(n) * E);
      for (auto& v : x) v = m.x_std * rng.normal();
      for (auto& v : logits) v = 1.5f * rng.normal();
      ck(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "x");
      ck(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), "logits");
      auto route = [&]() {
        return k3::cuda::moe_route(n, E, K, dl.as<float>(), db.as<float>(), true, 2.5f, di.as<int32_t>(),
                                   dwt.as<float>(), st);
      };
      auto experts = [&](const PathCfg& pc) {
        return k3::cuda::moe_experts(m.bank, n, K, dx.as<float>(), di.as<int32_t>(), dwt.as<float>(),
                                     s.mx ? GluAct::SiTU : GluAct::SiLU, 4.f, 25.f, dout.as<float>(), ws, st, pc.prec,
                                     pc.path);
      };
      ck(route(), "route");
      ck(cudaStreamSynchronize(st), "sync");
      std::vector<int> ids(static_cast<size_t>(n) * K);
      ck(cudaMemcpy(ids.data(), di.p, ids.size() * 4, cudaMemcpyDeviceToHost), "ids");
      const std::set<int> used(ids.begin(), ids.end());
      if (n >= 2048) {  // how the loads fall: the ring's tiles of up to 128 pairs, and how many are small
        std::vector<int> per(E, 0);
        for (int id : ids) per[id] += 1;
        int most = 0, tiles = 0, small = 0;
        for (int c : per) {
          most = std::max(most, c);
          tiles += (c + 127) / 128;
          small += c > 0 && (c % 128 == 0 ? 128 : c % 128) <= 16;
        }
        std::printf("[ timing ] %-11s n=%5d  routing%s: %zu experts used, pairs an expert max %d (mean %.1f), %d tiles of <= 128 pairs, "
                    "%d of <= 16\n",
                    s.name, n, bias_env && bias_env[0] == '0' ? " (no bias)" : "", used.size(), most,
                    static_cast<double>(n) * K / static_cast<double>(used.size()), tiles, small);
      }
      // Mean us of moe_experts (L2 flushed before each call) and of moe_route, over reps calls.
      auto time_path = [&](const PathCfg& pc, double& us, double& us_route) {
        ck(experts(pc), "warm");
        ck(cudaStreamSynchronize(st), "sync");
        const int reps = n >= 2048 ? 3 : 20;
        float ms_total = 0, ms_route = 0;
        for (int i = 0; i < reps; ++i) {
          ck(cudaMemsetAsync(flush.p, i & 0xff, 256u << 20, st), "flush");
          ck(cudaEventRecord(e0, st), "rec");
          ck(experts(pc), "time");
          ck(cudaEventRecord(e1, st), "rec");
          ck(cudaEventSynchronize(e1), "evsync");
          float ms = 0;
          ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
          ms_total += ms;
          ck(cudaEventRecord(e0, st), "rec");
          ck(route(), "time route");
          ck(cudaEventRecord(e1, st), "rec");
          ck(cudaEventSynchronize(e1), "evsync");
          ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
          ms_route += ms;
        }
        us = 1000.0 * ms_total / reps;
        us_route = 1000.0 * ms_route / reps;
      };
      const MoePath ap = k3::cuda::moe_experts_auto_path(n, K, E, s.mx ? k3::WeightFormat::MXFP4 : k3::WeightFormat::BF16);
      const char* auto_is = ap == MoePath::TensorCore ? "tc" : ap == MoePath::TcDecode ? "dec" : ap == MoePath::Gemv ? "gemv" : "simt";
      // Auto at every n; each forced path where it is a candidate: SIMT and the decode tensor-core kernels
      // up to n = 256, the 64-pair tensor-core tiles from n = 64.
      for (const PathCfg& pc : kPaths) {
        const bool wg_form = pc.path == MoePath::Wgmma || pc.path == MoePath::WgmmaRs || pc.path == MoePath::WgmmaRing;
        if ((pc.path == MoePath::TensorCore || wg_form) && n < 64) continue;
        if (wg_form && !wg_ok) continue;
        if (pc.path == MoePath::WgmmaRing && !k3::cuda::moe_wg::ring_supports(m.bank)) continue;
        if (pc.path == MoePath::Cutlass && (n < 64 || pc.cutlass_tile != 128 || !k3::cuda::moe_cutlass::supports(m.bank)))
          continue;  // (both tile shapes timed below under the 128 entries)
        if ((pc.path == MoePath::WgmmaRs || pc.path == MoePath::WgmmaRing) && !s.mx) continue;
        if ((pc.path == MoePath::Simt || pc.path == MoePath::TcDecode) && n > 256) continue;
        if (pc.path == MoePath::Gemv && n > 16) continue;
        const bool variants = pc.path == MoePath::TcDecode && s.mx;  // reg, ring, ring4; else the process's one
        const bool tiles = pc.path == MoePath::Cutlass;                // CUTLASS's 128- and 64-row tiles
        for (DecVariant v : {DecVariant::Reg, DecVariant::Ring, DecVariant::Ring4}) {
          if (!variants && !(tiles && v != DecVariant::Ring4) && v != DecVariant::Reg) continue;
          k3::cuda::moe_decode_set_variant(variants ? v : guard.saved);
          if (tiles) k3::cuda::moe_cutlass::set_tile_m(v == DecVariant::Reg ? 128 : 64);
          double us = 0, us_route = 0;
          time_path(pc, us, us_route);
          const double bytes = m.expert_bytes() * static_cast<double>(used.size());
          const double gbps = bytes / (us * 1e-6) / 1e9;
          const double tflops = 2.0 * 3.0 * n * K * static_cast<double>(s.I) * X / (us * 1e-6) / 1e12;
          const char* label = pc.path == MoePath::Auto              ? auto_is
                              : variants && v != DecVariant::Reg      ? variant_name(v)
                              : tiles                                 ? (v == DecVariant::Reg ? "t128" : "t64")
                                                                      : "";
          if (tiles) k3::cuda::moe_cutlass::set_tile_m(0);
          std::printf("[ timing ] %-11s n=%5d  experts used %4zu  %-9s%-6s moe_experts %10.1f us  %7.1f GB/s (%5.1f%% of "
                      "4.8 TB/s)  %6.2f TFLOP/s  moe_route %7.1f us\n",
                      s.name, n, used.size(), pc.name, label, us, gbps, gbps / 48.0, tflops, us_route);
        }
      }
      // The W4A8 path (MoePrecision::Mxfp8, MXFP8 activations) beside them, at decode sizes.
      if (s.mx && n <= 256 && k3::cuda::moe_w4a8_supported(m.bank)) {
        double us = 0, us_route = 0;
        time_path(PathCfg{MoePath::Auto, MoePrecision::Mxfp8, 0, "w4a8"}, us, us_route);
        const double gbps = m.expert_bytes() * static_cast<double>(used.size()) / (us * 1e-6) / 1e9;
        std::printf("[ timing ] %-11s n=%5d  experts used %4zu  %-9s%-6s moe_experts %10.1f us  %7.1f GB/s (%5.1f%% of "
                    "4.8 TB/s)  moe_route %7.1f us\n",
                    s.name, n, used.size(), "w4a8", "mxfp8", us, gbps, gbps / 48.0, us_route);
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(st);
  }
}

}  // namespace
