#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "k3/core/error.h"
#include "k3/model/config.h"
#include "k3/model/model_stats.h"
#include "test_util.h"

namespace {

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
nlohmann::json k3_json() { return nlohmann::json::parse(read_file(k3test::source_path("tests/data/configs/kimi-k3.json"))); }
nlohmann::json kl_json() {
  return nlohmann::json::parse(read_file(k3test::source_path("tests/data/configs/kimi-linear-48b-a3b.json")));
}
std::string parse_error(const nlohmann::json& j) {
  try {
    k3::parse_model_config(j.dump(), "config.json");
  } catch (const k3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, KimiK3Published) {
  auto c = k3::parse_model_config(k3_json().dump(), "kimi-k3.json");
  EXPECT_EQ(c.arch, k3::Arch::KimiK3);
  EXPECT_EQ(c.tensor_prefix, "language_model.model.");
  EXPECT_EQ(c.num_kda_layers(), 69);
  EXPECT_EQ(c.num_mla_layers(), 24);
  EXPECT_FALSE(c.is_kda[3]);   // 1-based layer 4 is full attention
  EXPECT_FALSE(c.is_kda[92]);  // and the last
  EXPECT_TRUE(c.is_kda[0]);
  EXPECT_EQ(c.expert_quant_format, k3::WeightFormat::MXFP4);
  EXPECT_EQ(c.act, k3::Activation::SiTU);
  ASSERT_TRUE(c.gate_lower_bound.has_value());
  EXPECT_EQ(*c.gate_lower_bound, -5.0f);
  EXPECT_EQ(c.eos_token_id, 163586);
  EXPECT_EQ(c.mla_cache_dim(), 576);

  auto s = k3::compute_stats(c);
  EXPECT_NEAR(s.params_total / 1e12, 2.78, 0.01);   // 2.78T
  EXPECT_NEAR(s.params_active / 1e9, 104.0, 1.0);   // ~104B active
  EXPECT_EQ(s.mla_cache_values_per_token, 24 * 576);
  // 27.6 KB per token in BF16 (model-spec 3.3), 13.5 KiB in FP8.
  EXPECT_EQ(s.mla_cache_values_per_token * 2, 27648);
  // KDA state 434 MB per sequence in fp32 (model-spec 3.2).
  EXPECT_EQ(s.kda_state_bytes_f32, 69LL * 96 * 128 * 128 * 4);
  EXPECT_NEAR(s.kda_state_bytes_f32 / 1e6, 434.1, 0.1);
}

TEST(Config, KimiLinearPublished) {
  auto c = k3::parse_model_config(kl_json().dump(), "kl.json");
  EXPECT_EQ(c.arch, k3::Arch::KimiLinear);
  EXPECT_EQ(c.num_kda_layers(), 20);
  EXPECT_EQ(c.num_mla_layers(), 7);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_FALSE(c.expert_quant_format.has_value());
  EXPECT_FALSE(c.gate_lower_bound.has_value());
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.446f);
  auto s = k3::compute_stats(c);
  EXPECT_NEAR(s.params_total / 1e9, 48.0, 1.5);   // 48B
  EXPECT_NEAR(s.params_active / 1e9, 3.0, 0.5);   // A3B
  EXPECT_NEAR(s.kda_state_bytes_f32 / 1e6, 42.0, 0.5);
}

// The trained context: max_position_embeddings, else model_max_length when a plain size (the next key llama.cpp's
// converter reads; k3's GGUF export writes it as <arch>.context_length, without which llama.cpp does not load the
// file; HF's 1e30 "no limit" and other sentinels are ignored), else 0.
TEST(Config, TrainedContextFromEitherKey) {
  auto j = kl_json();
  j.erase("max_position_embeddings");
  j.erase("model_max_length");
  EXPECT_EQ(k3::parse_model_config(j.dump(), "kl.json").max_position_embeddings, 0);
  j["model_max_length"] = 1048576;
  EXPECT_EQ(k3::parse_model_config(j.dump(), "kl.json").max_position_embeddings, 1048576);
  j["max_position_embeddings"] = 4096;  // the first key wins
  EXPECT_EQ(k3::parse_model_config(j.dump(), "kl.json").max_position_embeddings, 4096);
  j.erase("max_position_embeddings");
  for (const nlohmann::json& sentinel : {nlohmann::json(-1), nlohmann::json(1e30), nlohmann::json(uint64_t{1} << 40),
                                         nlohmann::json("4096")}) {  // no statement: ignored, not an error
    j["model_max_length"] = sentinel;
    EXPECT_EQ(k3::parse_model_config(j.dump(), "kl.json").max_position_embeddings, 0) << sentinel.dump();
  }
  j["max_position_embeddings"] = -1;  // the first key keeps its check
  EXPECT_NE(parse_error(j).find("max_position_embeddings: must be >= 0"), std::string::npos) << parse_error(j);
}

TEST(Config, ErrorsNameTheField) {
  auto j = kl_json();
  j.erase("hidden_size");
  EXPECT_NE(parse_error(j).find("hidden_size: required field is missing"), std::string::npos) << parse_error(j);

  j = kl_json();
  j["model_type"] = "llama";
  EXPECT_NE(parse_error(j).find("unknown architecture"), std::string::npos);

  j = kl_json();
  j["num_attention_heads"] = "many";
  EXPECT_NE(parse_error(j).find("num_attention_heads: has the wrong type"), std::string::npos) << parse_error(j);

  j = kl_json();
  j["linear_attn_config"]["kda_layers"].push_back(4);  // layer 4 in both lists
  EXPECT_NE(parse_error(j).find("exactly one"), std::string::npos) << parse_error(j);

  j = kl_json();
  j["hidden_act"] = "gelu";
  EXPECT_NE(parse_error(j).find("hidden_act"), std::string::npos);

  j = k3_json();
  j["text_config"].erase("kv_lora_rank");
  EXPECT_NE(parse_error(j).find("text_config.kv_lora_rank"), std::string::npos) << parse_error(j);

  j = k3_json();
  j["text_config"]["quantization_config"]["quant_method"] = "gptq";
  EXPECT_NE(parse_error(j).find("quant_method"), std::string::npos);

  EXPECT_NE(parse_error(nlohmann::json::array()).find("object"), std::string::npos);
  try {
    k3::parse_model_config("{\"model_type\": ", "bad.json");
    FAIL();
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid JSON"), std::string::npos);
  }
}
