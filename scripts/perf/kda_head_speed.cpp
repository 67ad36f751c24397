// What one head of a KDA decode step costs on the CPU at Kimi-Linear-48B's shapes (32 heads of D = 128, conv width
// 4, the recurrent state 64 KB a head in fp32, 32 KB in bf16), for the question why CpuBackend::kda_mix took more
// than its state traffic (88 us a layer at 16 threads for 2 + 2 MB). Modes (argv[1]):
//   rec  [dtype]         kda_recurrent_head_typed alone, one token: the state hot (one head's again and again) and
//                        cold (heads' states taken in a shuffled order from 512 MB of them, so every one comes
//                        from DRAM); dtype f32 (default) or bf16.
//   body [dtype] [hot]   kda_mix's per-head body piece by piece on one thread (the three convs, the two L2 norms,
//                        the decay gate and beta, the recurrence, the output norm and gate), each layer's state,
//                        conv tails and weights rotated over ~512 MB (cold) or one layer (`hot`).
//   op   [dtype] [threads] [layers]   CpuBackend::kda_mix itself, one decode token, layers rotated (default ~512 MB
//                        of them: 218 with fp32 states); us per call.
// K3_CPU_ISA=avx2 runs the avx2 kernels on an AVX-512 machine. Built against the library as built (a copy of an older
// libk3.a in its place gives the before / after pair, run alternately: the dev box's DRAM rate moves by 2x):
//   g++ -O3 -std=c++20 -mavx2 -mfma -mf16c -fopenmp-simd -Isrc scripts/perf/kda_head_speed.cpp build/release/libk3.a -lpthread -lpcre2-8 -o khs
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/vec_math.h"
#include "k3/core/dtype.h"
#include "k3/core/thread_pool.h"
#include "k3/model/graph/step.h"
#include "k3/model/weights.h"
#include "k3/runtime/sequence_cache.h"

namespace {

constexpr int H = 32, D = 128, W = 4, C = H * D, P = W - 1;
constexpr size_t DD = static_cast<size_t>(D) * D;
constexpr size_t kColdBytes = size_t{512} << 20;

using k3::CacheDType;

double tsc_ghz() {  // rdtsc ticks per ns
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t c0 = __rdtsc();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50)) {
  }
  const uint64_t c1 = __rdtsc();
  return static_cast<double>(c1 - c0) / std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<float> rnd(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// One token's inputs as kda_recurrent_head reads them: q, k unit rows (q / sqrt(D)), g <= 0, beta in (0, 1).
struct TokenInputs {
  std::vector<float> q, k, v, g, beta;
  explicit TokenInputs(std::mt19937& rng) : q(rnd(C, rng, -1, 1)), k(rnd(C, rng, -1, 1)), v(rnd(C, rng, -1, 1)),
                                            g(rnd(C, rng, -0.3f, 0)), beta(rnd(H, rng, 0.1f, 0.9f)) {
    for (int h = 0; h < H; ++h) {
      float sq = 0, sk = 0;
      for (int d = 0; d < D; ++d) sq += q[h * D + d] * q[h * D + d], sk += k[h * D + d] * k[h * D + d];
      for (int d = 0; d < D; ++d) q[h * D + d] /= std::sqrt(sq * D), k[h * D + d] /= std::sqrt(sk);
    }
  }
};

size_t state_bytes(CacheDType dt) { return DD * (dt == CacheDType::F32 ? 4 : 2); }

std::vector<uint8_t> random_states(size_t heads, CacheDType dt, std::mt19937& rng) {
  std::vector<uint8_t> s(heads * state_bytes(dt));
  const std::vector<float> f = rnd(DD, rng, -0.5f, 0.5f);  // one head's values, repeated (the speed is the same)
  for (size_t h = 0; h < heads; ++h)
    for (size_t i = 0; i < DD; ++i) {
      if (dt == CacheDType::F32)
        std::memcpy(s.data() + (h * DD + i) * 4, &f[i], 4);
      else
        reinterpret_cast<uint16_t*>(s.data())[h * DD + i] = k3::f32_to_bf16(f[i]);
    }
  return s;
}

// ---- rec: the recurrence alone ----

double time_rec(const TokenInputs& in, uint8_t* states, CacheDType dt, const std::vector<uint32_t>& order, int reps,
                double ghz) {
  std::vector<float> out(C), scratch(3 * D + DD);
  const size_t sb = state_bytes(dt);
  const uint64_t t0 = __rdtsc();
  for (int r = 0; r < reps; ++r)
    for (uint32_t i : order) {
      // the state of head i % H of layer i / H, seen as the whole [H][D][D] layer kda_recurrent_head_typed takes
      const int h = static_cast<int>(i % H);
      uint8_t* layer = states + (static_cast<size_t>(i) - h) * sb;
      k3::cpu::kda_recurrent_head_typed(1, H, D, h, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                        layer, dt, out.data(), scratch.data());
    }
  return static_cast<double>(__rdtsc() - t0) / ghz / 1e3 / (static_cast<double>(reps) * order.size());
}

void run_rec(CacheDType dt, double ghz) {
  std::mt19937 rng(1);
  const TokenInputs in(rng);
  const size_t sb = state_bytes(dt), heads = kColdBytes / sb;
  std::vector<uint8_t> states = random_states(heads, dt, rng);
  std::vector<uint32_t> cold(heads);
  std::iota(cold.begin(), cold.end(), 0u);
  std::shuffle(cold.begin(), cold.end(), rng);
  const std::vector<uint32_t> hot(64, 0u);  // head 0 of layer 0 again and again
  const double mb = 2.0 * sb / 1e3;          // state read + written, in kB (kB / us = GB/s)
  for (int pass = 0; pass < 3; ++pass) {
    const double th = time_rec(in, states.data(), dt, hot, 200, ghz), tc = time_rec(in, states.data(), dt, cold, 1, ghz);
    std::printf("rec %s D=%d: hot %.3f us/head (%.1f GB/s)   cold %.3f us/head (%.1f GB/s state traffic)\n",
                dt == CacheDType::F32 ? "f32" : "bf16", D, th, mb / th, tc, mb / tc);
  }
}

// ---- body: kda_mix's per-head work piece by piece ----

// Copies of cpu_backend_kda.cpp's file-local pieces (the same code: l2norm_heads, kda_gate_head's unbounded
// Kimi-Linear branch).
void l2norm_head(float* v, float scale) {
  double ss = 0;
  for (int d = 0; d < D; ++d) ss += static_cast<double>(v[d]) * v[d];
  const float inv = scale / std::sqrt(static_cast<float>(ss) + 1e-6f);
  for (int d = 0; d < D; ++d) v[d] *= inv;
}
void gate_head(float a, const float* bias, float* gr) {
  const __m256 na = _mm256_set1_ps(-a);
  k3::cpu::zip8(gr, bias, gr, D, [&](__m256 x, __m256 bi) { return _mm256_mul_ps(na, k3::cpu::softplus8(_mm256_add_ps(x, bi))); });
}

// One layer's KDA memory: weights, conv tails and recurrent state.
struct Layer {
  std::vector<float> qc, kc, vc, bias, a_exp, onorm, tq, tk, tv;
  std::vector<uint8_t> S;
  Layer(std::mt19937& rng, CacheDType dt)
      : qc(rnd(C * W, rng, -0.6f, 0.6f)), kc(rnd(C * W, rng, -0.6f, 0.6f)), vc(rnd(C * W, rng, -0.6f, 0.6f)),
        bias(rnd(C, rng, -1, 1)), a_exp(rnd(H, rng, 0.5f, 2)), onorm(rnd(D, rng, 0.5f, 1.5f)), tq(rnd(C * P, rng, -2, 2)),
        tk(rnd(C * P, rng, -2, 2)), tv(rnd(C * P, rng, -2, 2)), S(random_states(H, dt, rng)) {}
};

enum Piece { kConv, kNorm, kGate, kRec, kOut, kPieces };
const char* kPieceName[kPieces] = {"3 convs + SiLU", "2 L2 norms", "gate + beta", "recurrence", "rmsnorm + gate"};

void run_body(CacheDType dt, bool hot, double ghz) {
  std::mt19937 rng(2);
  const size_t per_layer = state_bytes(dt) * H + sizeof(float) * (3 * C * W + 3 * C * P + C);
  const int L = hot ? 1 : static_cast<int>(kColdBytes / per_layer);
  std::vector<Layer> layers;
  for (int l = 0; l < L; ++l) layers.emplace_back(rng, dt);
  const std::vector<float> pq = rnd(C, rng, -2, 2), pk = rnd(C, rng, -2, 2), pv = rnd(C, rng, -2, 2),
                           graw0 = rnd(C, rng, -3, 1), braw0 = rnd(H, rng, -2, 2), gproj = rnd(C, rng, -2, 2);
  std::vector<float> q(C), k(C), v(C), g(C), beta(H), o(C), scratch(3 * D + DD);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int pass = 0; pass < 3; ++pass) {
    uint64_t ticks[kPieces] = {};
    const int reps = hot ? 1000 : 1;
    int64_t heads = 0;
    for (int r = 0; r < reps; ++r)
      for (Layer& ly : layers) {
        g = graw0, beta = braw0;  // the gate works in place on its raw projection
        for (int h = 0; h < H; ++h, ++heads) {
          const int c0 = h * D;
          uint64_t t = __rdtsc(), u;
          k3::cpu::short_conv_silu_channels(1, C, W, pq.data(), ly.qc.data(), ly.tq.data(), q.data(), c0, c0 + D);
          k3::cpu::short_conv_silu_channels(1, C, W, pk.data(), ly.kc.data(), ly.tk.data(), k.data(), c0, c0 + D);
          k3::cpu::short_conv_silu_channels(1, C, W, pv.data(), ly.vc.data(), ly.tv.data(), v.data(), c0, c0 + D);
          u = __rdtsc(), ticks[kConv] += u - t, t = u;
          l2norm_head(q.data() + c0, q_scale);
          l2norm_head(k.data() + c0, 1.0f);
          u = __rdtsc(), ticks[kNorm] += u - t, t = u;
          gate_head(ly.a_exp[h], ly.bias.data() + c0, g.data() + c0);
          k3::cpu::sigmoid_inplace(beta.data() + h, 1);
          u = __rdtsc(), ticks[kGate] += u - t, t = u;
          k3::cpu::kda_recurrent_head_typed(1, H, D, h, q.data(), k.data(), v.data(), g.data(), beta.data(), ly.S.data(), dt,
                                            o.data(), scratch.data());
          u = __rdtsc(), ticks[kRec] += u - t, t = u;
          k3::cpu::rmsnorm(o.data() + c0, ly.onorm.data(), 1, D, 1e-5f, o.data() + c0);
          k3::cpu::sigmoid_mul(o.data() + c0, gproj.data() + c0, D);
          u = __rdtsc(), ticks[kOut] += u - t;
        }
      }
    const double total = std::accumulate(ticks, ticks + kPieces, 0.0) / ghz / 1e3 / heads;
    std::printf("body %s %s: %.3f us/head (%.1f GB/s state traffic):", dt == CacheDType::F32 ? "f32" : "bf16",
                hot ? "hot" : "cold", total, 2.0 * state_bytes(dt) / 1e3 / total);
    for (int p = 0; p < kPieces; ++p) {
      const double us = ticks[p] / ghz / 1e3 / heads;
      std::printf("  %s %.3f (%.0f%%)", kPieceName[p], us, 100 * us / total);
    }
    std::printf("\n");
  }
}

// ---- op: CpuBackend::kda_mix ----

class BenchCache final : public k3::SequenceCache {
 public:
  BenchCache(k3::CacheSpec spec, std::vector<Layer>& layers) : spec_(spec), layers_(layers) {}
  const k3::CacheSpec& spec() const override { return spec_; }
  int64_t n_past() const override { return 5; }
  k3::KdaStateView kda_state(int64_t l) override {
    Layer& ly = layers_[static_cast<size_t>(l)];
    return {ly.S.data(), ly.tq.data(), ly.tk.data(), ly.tv.data()};
  }
  k3::MlaPageTable mla_pages() override { return {}; }
  void reserve(int64_t) override {}
  void advance(int64_t) override {}
  std::unique_ptr<k3::SequenceCache> clone() const override { return nullptr; }

 private:
  k3::CacheSpec spec_;
  std::vector<Layer>& layers_;
};

k3::KdaWeights layer_weights(const Layer& ly) {
  k3::KdaWeights w;
  w.q_conv = k3::WeightVector::view(ly.qc.data(), ly.qc.size());
  w.k_conv = k3::WeightVector::view(ly.kc.data(), ly.kc.size());
  w.v_conv = k3::WeightVector::view(ly.vc.data(), ly.vc.size());
  w.dt_bias = k3::WeightVector::view(ly.bias.data(), ly.bias.size());
  w.A_exp = k3::WeightVector::view(ly.a_exp.data(), ly.a_exp.size());
  w.A_log = w.A_exp;  // read only where A_exp is empty
  w.o_norm = k3::WeightVector::view(ly.onorm.data(), ly.onorm.size());
  return w;
}

void run_op(CacheDType dt, int threads, int L, double ghz) {
  k3::ThreadPool::configure_global(threads);
  std::mt19937 rng(3);
  std::vector<Layer> layers;
  for (int l = 0; l < L; ++l) layers.emplace_back(rng, dt);
  std::vector<k3::KdaWeights> ws;
  for (const Layer& ly : layers) ws.push_back(layer_weights(ly));
  k3::CacheSpec spec;
  spec.kda_layers = L, spec.kda_heads = H, spec.kda_head_dim = D, spec.kda_conv_floats = C * P, spec.kda_state_dtype = dt;
  BenchCache cache(spec, layers);
  k3::graph::StepPlan plan;
  plan.seqs.push_back(k3::graph::StepSeq{0, 1, 5, &cache, false, 0, 0});
  plan.tokens = {1};
  std::vector<float> pq = rnd(C, rng, -2, 2), pk = rnd(C, rng, -2, 2), pv = rnd(C, rng, -2, 2), g0 = rnd(C, rng, -3, 1),
                     b0 = rnd(H, rng, -2, 2), gp = rnd(C, rng, -2, 2), g(C), b(H), o(C);
  k3::cpu::CpuBackend be;
  be.begin_step(plan);
  const k3::graph::KdaDims dims{H, D, W};
  auto T = [](std::vector<float>& v, int64_t cols) { return k3::graph::Tensor::f32(v.data(), 1, cols); };
  for (int pass = 0; pass < 4; ++pass) {
    const int calls = std::max(L, 200);
    uint64_t ticks = 0;
    for (int i = 0; i < calls; ++i) {
      g = g0, b = b0;
      const uint64_t t = __rdtsc();
      be.kda_mix(i % L, ws[static_cast<size_t>(i % L)], dims, k3::graph::KdaGate{}, 1e-5f, T(pq, C), T(pk, C), T(pv, C), T(g, C),
                 T(b, H), T(gp, C), T(o, C));
      ticks += __rdtsc() - t;
    }
    const double us = ticks / ghz / 1e3 / calls;
    std::printf("op %s threads=%d layers=%d: %.2f us/call (%.1f GB/s state traffic)\n", dt == CacheDType::F32 ? "f32" : "bf16",
                threads, L, us, 2.0 * state_bytes(dt) * H / 1e3 / us);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "rec";
  const CacheDType dt = argc > 2 && std::string(argv[2]) == "bf16" ? CacheDType::BF16 : CacheDType::F32;
  const double ghz = tsc_ghz();
  if (mode == "rec") {
    run_rec(dt, ghz);
  } else if (mode == "body") {
    run_body(dt, argc > 3 && std::string(argv[3]) == "hot", ghz);
  } else if (mode == "op") {
    const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
    const size_t per_layer = state_bytes(dt) * H + sizeof(float) * (3 * C * W + 3 * C * P + C);
    run_op(dt, threads, argc > 4 ? std::atoi(argv[4]) : static_cast<int>(kColdBytes / per_layer), ghz);
  } else {
    std::fprintf(stderr, "usage: %s rec|body|op [f32|bf16] [hot | threads [layers]]\n", argv[0]);
    return 2;
  }
  return 0;
}
