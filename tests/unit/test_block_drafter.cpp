// The block drafter (docs/block-drafter.md): its ops on the CPU backend (block attention, strided and
// broadcast copies) against float64 references on random inputs, the drafter's forward against an
// independent float64 implementation of the document's arithmetic (drafter_test_util.h) on a random drafter
// for k3-tiny, its invariances (batch, n_out, how the target's weights are reached), and clear errors for
// bad config.json / tensors / inputs. The Python golden: test_drafter_golden.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/model/drafter/block_drafter.h"
#include "k3/model/model.h"
#include "drafter_test_util.h"
#include "test_util.h"

namespace {

using k3::graph::Tensor;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(BlockDrafterOps, BlockAttentionMatchesFloat64) {
  k3::cpu::CpuBackend b;
  const k3::graph::StepPlan plan;
  b.begin_step(plan);
  for (const auto [block, heads, hd] : {std::array<int64_t, 3>{1, 2, 16}, {3, 1, 8}, {8, 4, 64}, {7, 3, 32}}) {
    const int64_t N = block * 5, C = heads * hd;
    std::vector<float> q = random_floats(static_cast<size_t>(N * C), 1, 2.f), k = random_floats(q.size(), 2, 2.f),
                       v = random_floats(q.size(), 3), o(q.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    b.block_attention(Tensor::f32(q.data(), N, C), Tensor::f32(k.data(), N, C), Tensor::f32(v.data(), N, C), block, heads, hd,
                      scale, Tensor::f32(o.data(), N, C));
    double err = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t m = 0; m < heads; ++m) {
        const int64_t r0 = i / block * block;
        std::vector<double> s(static_cast<size_t>(block));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < block; ++j) {
          for (int64_t d = 0; d < hd; ++d) s[static_cast<size_t>(j)] += double(q[size_t(i * C + m * hd + d)]) * k[size_t((r0 + j) * C + m * hd + d)];
          mx = std::max(mx, s[static_cast<size_t>(j)] *= scale);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double want = 0;
          for (int64_t j = 0; j < block; ++j) want += s[static_cast<size_t>(j)] / sum * v[size_t((r0 + j) * C + m * hd + d)];
          err = std::max(err, std::abs(want - o[size_t(i * C + m * hd + d)]));
        }
      }
    EXPECT_LT(err, 1e-6) << "block " << block << " heads " << heads << " hd " << hd;  // fp32 output of float64 sums
  }
  std::vector<float> x(30);
  EXPECT_THROW(b.block_attention(Tensor::f32(x.data(), 5, 6), Tensor::f32(x.data(), 5, 6), Tensor::f32(x.data(), 5, 6), 2, 1, 6,
                                 1.f, Tensor::f32(x.data(), 5, 6)),
               k3::Error);  // 5 rows are not whole blocks of 2
}

TEST(BlockDrafterOps, CopyHandlesStridedAndBroadcastViews) {
  k3::cpu::CpuBackend b;
  std::vector<float> src = random_floats(4 * 6, 9), dst(4 * 10, -7.f);
  // Columns 2..5 of a [4][6] source into columns 5..8 of a [4][10] destination.
  b.copy(Tensor{dst.data() + 5, 4, 4, 10, k3::graph::ElemType::F32}, Tensor{src.data() + 2, 4, 4, 6, k3::graph::ElemType::F32});
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 10; ++c)
      EXPECT_EQ(dst[size_t(r * 10 + c)], c >= 5 && c < 9 ? src[size_t(r * 6 + c - 3)] : -7.f) << r << "," << c;
  // Broadcast: stride 0 repeats one row.
  b.copy(Tensor::f32(dst.data(), 4, 10), Tensor{dst.data() + 30, 4, 10, 0, k3::graph::ElemType::F32});
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 10; ++c) EXPECT_EQ(dst[size_t(r * 10 + c)], dst[size_t(30 + c)]);
  EXPECT_THROW(b.copy(Tensor::f32(dst.data(), 4, 10), Tensor::f32(src.data(), 4, 6)), k3::Error);
}

k3::Model& tiny() {
  static auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  return *m;
}

std::unique_ptr<k3::drafter::BlockDrafter> load_for_tiny(const std::string& dir) {
  const k3::Model& m = tiny();
  return k3::drafter::BlockDrafter::load(dir, m.config(), m.weights().embed, m.weights().lm_head);
}

// Random taps of a plausible scale (normed hidden states are ~unit per element) and distinct last tokens.
struct Inputs {
  std::vector<float> ctx;
  std::vector<int32_t> last;
};
Inputs random_inputs(const k3::drafter::DrafterConfig& c, int64_t R, uint32_t seed) {
  Inputs in{random_floats(static_cast<size_t>(R * c.ctx_dim()), seed, 1.7f), {}};
  for (int64_t r = 0; r < R; ++r) in.last.push_back(static_cast<int32_t>((977 * r + 13 * seed) % c.target_vocab_size));
  return in;
}

TEST(BlockDrafter, ForwardMatchesFloat64Reference) {
  const k3::Model& m = tiny();
  const auto d = k3test::write_random_drafter(m.config(), {}, 42);
  const auto drafter = load_for_tiny(d->path());
  const auto& c = drafter->config();
  const int64_t R = 3, B = c.block_size, V = c.target_vocab_size;
  const Inputs in = random_inputs(c, R, 5);
  std::vector<float> got;
  drafter->forward(in.ctx, in.last, B, got);
  const auto want = k3test::reference_drafter_logits(
      *d, in.ctx, in.last, [&](int32_t id, float* out) { k3::cpu::dequant_row(m.weights().embed, id, out); },
      [&](int64_t v, float* out) { k3::cpu::dequant_row(m.weights().lm_head, v, out); });
  ASSERT_EQ(got.size(), want.size());
  double err = 0, scale = 0;
  int64_t argmax_diff = 0;
  for (int64_t r = 0; r < R * B; ++r) {
    int64_t ag = 0, aw = 0;
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(r * V + v);
      err = std::max(err, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
      if (got[i] > got[size_t(r * V + ag)]) ag = v;
      if (want[i] > want[size_t(r * V + aw)]) aw = v;
    }
    argmax_diff += ag != aw;
  }
  std::printf("  drafter logits vs float64: max |diff| %.3e of max |logit| %.2f (rel %.3e)\n", err, scale, err / scale);
  EXPECT_LT(err / scale, 2e-5);  // fp32 GEMMs over bf16 weights (~2e-6 measured)
  EXPECT_EQ(argmax_diff, 0);
  EXPECT_GT(scale, 1.0);  // logits of a real spread (a test on near-zero values would prove little)
}

TEST(BlockDrafter, BatchedEqualsAloneAndFewerPositionsEqualTheirRows) {
  const auto d = k3test::write_random_drafter(tiny().config(), {}, 7);
  const auto drafter = load_for_tiny(d->path());
  const auto& c = drafter->config();
  const int64_t R = 4, B = c.block_size, V = c.target_vocab_size, D = c.ctx_dim();
  const Inputs in = random_inputs(c, R, 11);
  std::vector<float> all, one, few;
  drafter->forward(in.ctx, in.last, B, all);
  for (int64_t r = 0; r < R; ++r) {
    drafter->forward(std::span(in.ctx).subspan(size_t(r * D), size_t(D)), std::span(in.last).subspan(size_t(r), 1), B, one);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + r * B * V)) << "draft " << r;  // batch-invariant CPU kernels
  }
  drafter->forward(in.ctx, in.last, 3, few);  // the head on positions 0..2 only; the layers still see all 8
  for (int64_t r = 0; r < R; ++r)
    EXPECT_TRUE(std::equal(few.begin() + r * 3 * V, few.begin() + (r + 1) * 3 * V, all.begin() + r * B * V)) << r;
  std::vector<int32_t> drafts;
  drafter->draft(in.ctx, in.last, 3, drafts);
  ASSERT_EQ(drafts.size(), size_t(R * 3));
  for (int64_t i = 0; i < R * 3; ++i) {
    const float* row = few.data() + i * V;
    EXPECT_EQ(drafts[size_t(i)], std::max_element(row, row + V) - row);
  }
}

TEST(BlockDrafter, TargetWeightsFromItsFilesEqualTheModelsOwn) {
  const auto d = k3test::write_random_drafter(tiny().config(), {}, 3);
  const auto a = load_for_tiny(d->path());
  const auto b = k3::drafter::BlockDrafter::load(d->path(), k3test::source_path("models/k3-tiny"));
  const Inputs in = random_inputs(a->config(), 2, 1);
  std::vector<float> la, lb;
  a->forward(in.ctx, in.last, 4, la);
  b->forward(in.ctx, in.last, 4, lb);
  EXPECT_EQ(la, lb);
}

// Loads `dir` after `edit` changed its config.json; returns the error text ("" when it loaded).
template <typename Edit>
std::string load_error(const k3test::RandomDrafter& d, Edit edit, const k3::ModelConfig* target = nullptr) {
  nlohmann::json j = d.config;
  edit(j);
  std::ofstream(d.path() + "/config.json") << j.dump();
  try {
    const k3::Model& m = tiny();
    k3::drafter::BlockDrafter::load(d.path(), target ? *target : m.config(), m.weights().embed, m.weights().lm_head);
  } catch (const k3::Error& e) {
    std::ofstream(d.path() + "/config.json") << d.config.dump();
    return e.what();
  }
  std::ofstream(d.path() + "/config.json") << d.config.dump();
  return "";
}

TEST(BlockDrafter, BadConfigsAreClearErrors) {
  const auto d = k3test::write_random_drafter(tiny().config(), {}, 1);
  using J = nlohmann::json;
  const std::vector<std::pair<std::function<void(J&)>, std::string>> cases = {
      {[](J& j) { j.erase("block_size"); }, "block_size: required field is missing"},
      {[](J& j) { j["hidden_size"] = "256"; }, "hidden_size: must be an integer"},
      {[](J& j) { j["num_attention_heads"] = 0; }, "num_attention_heads: must be in 1.."},
      {[](J& j) { j["block_size"] = 1000; }, "block_size: must be in 1..64"},
      {[](J& j) { j["rms_norm_eps"] = -1; }, "rms_norm_eps: must be a number in (0, 1)"},
      {[](J& j) { j["architectures"] = {"KimiLinearForCausalLM"}; }, "architectures: expected [\"K3BlockDrafter\"]"},
      {[](J& j) { j["target_layer_ids"] = J::array(); }, "target_layer_ids: must be a list"},
      {[](J& j) { j["target_layer_ids"] = {2, 13}; }, "13 is not a tap id in 0..target_num_layers (12)"},
      {[](J& j) { j["hidden_size"] = 128; }, "differs from target_hidden_size"},
      {[](J& j) { j["target_vocab_size"] = 8000; }, "target_vocab_size 8000 does not match the target's vocab_size 8192"},
      {[](J& j) { j["target_num_layers"] = 13; }, "target_num_layers 13 does not match the target's num_hidden_layers 12"},
      {[](J& j) { j["head_dim"] = 8; }, "'layers.0.q_proj.weight'"},        // config vs tensors: shape list
      {[](J& j) { j["num_hidden_layers"] = 3; }, "missing tensor 'layers.2.attn_norm.weight'"},
  };
  for (const auto& [edit, want] : cases) {
    const std::string e = load_error(*d, edit);
    EXPECT_NE(e.find(want), std::string::npos) << "want \"" << want << "\" in: " << e;
  }
  EXPECT_EQ(load_error(*d, [](J&) {}), "");
  std::ofstream(d->path() + "/config.json") << "{\"hidden_size\": ";
  EXPECT_THROW(load_for_tiny(d->path()), k3::Error);
  EXPECT_THROW(load_for_tiny(d->path() + "/nonexistent"), k3::Error);
}

TEST(BlockDrafter, BadTensorsAndInputsAreClearErrors) {
  const auto d = k3test::write_random_drafter(tiny().config(), {}, 2);
  // A tensor of the wrong dtype: rewrite the file with one entry as I32.
  auto [h, data] = k3test::read_safetensors_raw(d->path() + "/model.safetensors");
  h["final_norm.weight"]["dtype"] = "I32";
  k3test::write_safetensors_raw(d->path() + "/model.safetensors", h, data);
  try {
    load_for_tiny(d->path());
    ADD_FAILURE() << "loaded a drafter with an I32 norm";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("final_norm.weight"), std::string::npos) << e.what();
  }
  const auto good = k3test::write_random_drafter(tiny().config(), {}, 2);
  const auto drafter = load_for_tiny(good->path());
  const Inputs in = random_inputs(drafter->config(), 2, 3);
  std::vector<float> out;
  const std::vector<int32_t> bad_id{0, 8192};
  EXPECT_THROW(drafter->forward(in.ctx, bad_id, 2, out), k3::Error);
  EXPECT_THROW(drafter->forward(std::span(in.ctx).first(in.ctx.size() - 1), in.last, 2, out), k3::Error);
  EXPECT_THROW(drafter->forward(in.ctx, in.last, 0, out), k3::Error);
  EXPECT_THROW(drafter->forward(in.ctx, in.last, 9, out), k3::Error);
  EXPECT_THROW(drafter->forward(in.ctx, {}, 2, out), k3::Error);
  drafter->forward(in.ctx, in.last, 2, out);  // and still works after the refusals
  EXPECT_EQ(out.size(), size_t(2 * 2 * 8192));
}

}  // namespace
