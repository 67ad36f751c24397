// The C++ forward pass against code the project did not write (issue 12 item 5): goldens produced by
// independent implementations, run by hand (python/oracles/, docs/testing.md "Independent oracles") and
// committed with the versions and command that made them, so CI needs neither torch nor transformers.
//
// HfOracle: HF transformers' native kimi_linear (5.24.0, fp32, CPU) on tests/data/tiny-kimi-linear,
// tests/data/goldens/tiny-kimi-linear-hf/. HF builds the MLA q_a / kv_a norms with eps 1e-6 (its RMSNorm
// default) instead of the spec's rms_norm_eps, so k3 runs the checkpoint with its `mla_norm_eps: 1e-6`
// knob: the same reading of the model, then compared in fp32 vs fp32.
//
// LlamaCppOracle: llama.cpp's kimi-linear graph (commit 0c1e5709, CPU, F32 GGUF with an fp32 KV cache) on the
// same checkpoint and tokens, tests/data/goldens/tiny-kimi-linear-llamacpp/. llama.cpp builds kv_a_layernorm
// with rms_norm_eps, as the spec does, so k3 runs the checkpoint unedited.
#include <gtest/gtest.h>

#include <span>

#include "checkpoint_edit.h"
#include "golden_util.h"
#include "k3/model/model.h"

namespace {

using k3test::compare_logits;
using k3test::EditableCheckpoint;

// Tolerance of k3 (fp32) against HF (fp32): both carry fp32 rounding of the same size (HF's own prefill vs
// decode differ by 2.06e-6; HF vs k3ref float64 2.14e-6; k3 vs k3ref float64 8.4e-7). Measured k3 vs HF
// (release, AVX2, K3_NUM_THREADS=1 and 2, identical): prefill 1.87e-6, decode 1.08e-6 -> 6e-6, 3.2x over
// the larger. The spec-vs-HF eps difference on this checkpoint (3.8e-6, docs/testing.md) is inside that;
// the mutation tests cover the eps on the -mlanorm checkpoint.
constexpr double kHfTol = 6e-6;

// Tolerance of k3 against llama.cpp (both fp32): llama.cpp's own prefill vs decode differ by 1.27e-6 and
// it is 1.27e-6 from k3ref float64. Measured k3 vs llama.cpp (1 and 2 threads): prefill 1.41e-6, decode
// 1.33e-6 -> 4e-6 (2.8x).
constexpr double kLlamaCppTol = 4e-6;

// k3 on a copy of tiny-kimi-linear; `hf_mla_eps` reproduces HF's MLA norm eps (1e-6), otherwise the spec's.
struct KimiLinearRun {
  EditableCheckpoint ck{"tiny-kimi-linear"};
  std::unique_ptr<k3::Model> model;
  std::vector<int32_t> tokens = k3test::golden_tokens("tiny-kimi-linear");
  explicit KimiLinearRun(bool hf_mla_eps) {
    if (hf_mla_eps) ck.edit_config([](nlohmann::json& c) { c["mla_norm_eps"] = 1e-6; });
    model = k3::Model::load(ck.str());
  }
  std::vector<float> prefill() { return k3test::prefill_all_logits(*model, tokens); }
  std::vector<float> decode() {
    auto d = k3test::decode_all_logits(*model, tokens);
    EXPECT_EQ(d.n_past, std::ssize(tokens));
    return d.logits;
  }
};

void expect_matches(const std::vector<float>& k3, const char* golden_dir, const char* file, int64_t rows, double tol) {
  const auto ref = k3test::golden_logits(golden_dir, file);
  ASSERT_EQ(k3.size(), ref.size());
  const auto c = compare_logits(k3, ref, rows, static_cast<int64_t>(ref.size()) / rows);
  std::printf("k3 vs %s %s: rel %.3g (tolerance %.1g), argmax mismatches %d\n", golden_dir, file, c.rel, tol,
              c.argmax_mismatch);
  EXPECT_LT(c.rel, tol) << golden_dir << "/" << file;
  EXPECT_EQ(c.argmax_mismatch, 0) << golden_dir << "/" << file;
}

}  // namespace

TEST(HfOracle, PrefillMatchesTransformersKimiLinear) {
  KimiLinearRun r(true);
  expect_matches(r.prefill(), "tiny-kimi-linear-hf", "logits_prefill.npy", std::ssize(r.tokens), kHfTol);
}

TEST(HfOracle, DecodeMatchesTransformersKimiLinear) {
  KimiLinearRun r(true);
  expect_matches(r.decode(), "tiny-kimi-linear-hf", "logits_decode.npy", std::ssize(r.tokens), kHfTol);
}

TEST(LlamaCppOracle, PrefillMatchesLlamaCppKimiLinear) {
  KimiLinearRun r(false);
  expect_matches(r.prefill(), "tiny-kimi-linear-llamacpp", "logits_prefill.npy", std::ssize(r.tokens), kLlamaCppTol);
}

TEST(LlamaCppOracle, DecodeMatchesLlamaCppKimiLinear) {
  KimiLinearRun r(false);
  expect_matches(r.decode(), "tiny-kimi-linear-llamacpp", "logits_decode.npy", std::ssize(r.tokens), kLlamaCppTol);
}
