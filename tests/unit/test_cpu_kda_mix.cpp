// CpuBackend::kda_mix runs a decode step's KDA parts (conv + norms, gates, recurrence, output gate) per
// (sequence, head) in one parallel pass; the graph relies on it giving exactly the bits of the four separate
// ops (Backend::kda_mix's composition, which prefill and speculative steps still take), so that decode logits
// do not depend on which form ran. Checked bitwise here: outputs, recurrent states and conv tails, for several
// sequences of 1..4 tokens, fp32 and bf16 states, the bounded (K3) and unbounded (Kimi-Linear) decay gates, and
// a step the fused form must decline (a prefill-form sequence beside decode ones), which must still match.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/core/dtype.h"
#include "k3/model/graph/step.h"
#include "k3/model/weights.h"
#include "k3/runtime/sequence_cache.h"

namespace {

using k3::graph::Tensor;

constexpr int kH = 4, kD = 16, kW = 4, kC = kH * kD;

std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo = -2.f, float hi = 2.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// One sequence's KDA state of one layer in host vectors (the state in the spec's dtype).
class FakeCache final : public k3::SequenceCache {
 public:
  FakeCache(k3::CacheSpec spec, std::mt19937& rng) : spec_(spec) {
    const size_t n = static_cast<size_t>(kH) * kD * kD;
    const std::vector<float> s = random_vec(n, rng, -0.5f, 0.5f);
    S_.resize(static_cast<size_t>(spec_.kda_state_bytes()));
    if (spec_.kda_state_dtype == k3::CacheDType::F32) {
      std::memcpy(S_.data(), s.data(), S_.size());
    } else {
      auto* p = reinterpret_cast<uint16_t*>(S_.data());
      for (size_t i = 0; i < n; ++i) p[i] = k3::f32_to_bf16(s[i]);
    }
    for (auto* c : {&cq_, &ck_, &cv_}) *c = random_vec(static_cast<size_t>(spec_.kda_conv_floats), rng);
  }
  const k3::CacheSpec& spec() const override { return spec_; }
  int64_t n_past() const override { return 5; }
  k3::KdaStateView kda_state(int64_t) override { return {S_.data(), cq_.data(), ck_.data(), cv_.data()}; }
  k3::MlaPageTable mla_pages() override { return {}; }
  void reserve(int64_t) override {}
  void advance(int64_t) override {}
  std::unique_ptr<k3::SequenceCache> clone() const override { return std::make_unique<FakeCache>(*this); }

  std::vector<uint8_t> S_;
  std::vector<float> cq_, ck_, cv_;

 private:
  k3::CacheSpec spec_;
};

struct Inputs {
  std::vector<float> pq, pk, pv, g, beta, gate;
};

k3::KdaWeights random_weights(std::mt19937& rng) {
  k3::KdaWeights w;
  w.q_conv = random_vec(kC * kW, rng, -0.6f, 0.6f);
  w.k_conv = random_vec(kC * kW, rng, -0.6f, 0.6f);
  w.v_conv = random_vec(kC * kW, rng, -0.6f, 0.6f);
  w.dt_bias = random_vec(kC, rng, -1.f, 1.f);
  w.A_log = random_vec(kH, rng, -1.f, 1.f);
  w.o_norm = random_vec(kD, rng, 0.5f, 1.5f);
  return w;
}

// Runs kda_mix on `seqs` (n tokens each, prefill form where asked) either through CpuBackend's override or
// through Backend's composition of the separate ops; returns o, then every cache's S and conv tails appended.
std::vector<float> run(bool fused, const k3::KdaWeights& w, const k3::graph::KdaGate& gate, k3::CacheSpec spec,
                       const std::vector<int>& ns, const std::vector<bool>& prefill, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<FakeCache>> caches;
  k3::graph::StepPlan plan;
  int64_t N = 0;
  for (size_t i = 0; i < ns.size(); ++i) {
    caches.push_back(std::make_unique<FakeCache>(spec, rng));
    k3::graph::StepSeq s;
    s.offset = N;
    s.n = ns[i];
    s.past = 5;
    s.cache = caches.back().get();
    s.prefill_form = prefill[i];
    plan.seqs.push_back(s);
    N += ns[i];
  }
  plan.tokens.assign(static_cast<size_t>(N), 1);
  Inputs in{random_vec(N * kC, rng), random_vec(N * kC, rng), random_vec(N * kC, rng), random_vec(N * kC, rng, -3.f, 1.f),
            random_vec(N * kH, rng), random_vec(N * kC, rng)};
  std::vector<float> o(static_cast<size_t>(N * kC), -7.f);
  k3::cpu::CpuBackend be;
  be.begin_step(plan);
  const k3::graph::KdaDims d{kH, kD, kW};
  auto T = [&](std::vector<float>& v, int64_t cols) { return Tensor::f32(v.data(), N, cols); };
  if (fused)
    be.kda_mix(0, w, d, gate, 1e-5f, T(in.pq, kC), T(in.pk, kC), T(in.pv, kC), T(in.g, kC), T(in.beta, kH), T(in.gate, kC), T(o, kC));
  else
    be.k3::graph::Backend::kda_mix(0, w, d, gate, 1e-5f, T(in.pq, kC), T(in.pk, kC), T(in.pv, kC), T(in.g, kC),
                                   T(in.beta, kH), T(in.gate, kC), T(o, kC));
  std::vector<float> all = o;
  for (auto& c : caches) {
    const size_t nS = c->S_.size() / 4;
    const size_t at = all.size();
    all.resize(at + nS);
    std::memcpy(all.data() + at, c->S_.data(), c->S_.size());
    for (auto* t : {&c->cq_, &c->ck_, &c->cv_}) all.insert(all.end(), t->begin(), t->end());
  }
  return all;
}

TEST(CpuKdaMix, DecodePassHasTheBitsOfTheSeparateOps) {
  std::mt19937 rng(5);
  const k3::KdaWeights w = random_weights(rng);
  for (k3::CacheDType dt : {k3::CacheDType::F32, k3::CacheDType::BF16}) {
    k3::CacheSpec spec;
    spec.kda_layers = 1;
    spec.kda_heads = kH;
    spec.kda_head_dim = kD;
    spec.kda_conv_floats = kC * (kW - 1);
    spec.kda_state_dtype = dt;
    for (const k3::graph::KdaGate gate : {k3::graph::KdaGate{}, k3::graph::KdaGate{true, -5.f}}) {
      // decode steps (fused), then one with a prefill-form sequence (declined: the separate ops both ways)
      const std::vector<std::pair<std::vector<int>, std::vector<bool>>> steps = {
          {{1}, {false}}, {{1, 1, 1}, {false, false, false}}, {{1, 3, 4, 2}, {false, false, false, false}}, {{1, 3}, {false, true}}};
      for (const auto& [ns, pf] : steps) {
        const uint64_t calls0 = k3::cpu::CpuBackend::fused_kda_mix_calls();
        const std::vector<float> a = run(true, w, gate, spec, ns, pf, 99);
        const bool declined = std::find(pf.begin(), pf.end(), true) != pf.end();
        // The one-pass form ran for the decode steps (else this compares the separate ops with themselves), and only
        // for them.
        EXPECT_EQ(k3::cpu::CpuBackend::fused_kda_mix_calls() - calls0, declined ? 0u : 1u) << "seqs " << ns.size();
        const std::vector<float> b = run(false, w, gate, spec, ns, pf, 99);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
            << "dtype " << k3::cache_dtype_name(dt) << " bounded " << gate.bounded << " seqs " << ns.size();
        // The step did something: outputs are finite and not the poison.
        size_t moved = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_TRUE(std::isfinite(a[i]));
          moved += a[i] != -7.f;
        }
        EXPECT_GT(moved, a.size() / 2);
      }
    }
  }
}

}  // namespace
