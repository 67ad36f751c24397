// Weight placement (model/placement.h): llama.cpp's -ot / --cpu-moe / --n-cpu-moe rules over checkpoint
// tensor names, and the binder giving every matrix its home.
#include <gtest/gtest.h>

#include "k3/core/error.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/placement.h"
#include "k3/model/weights.h"
#include "test_util.h"

using k3::kHostDevice;
using k3::Placement;

namespace {
const std::string kExpert = "language_model.model.layers.3.block_sparse_moe.experts.12.w1.weight";
const std::string kShared = "language_model.model.layers.3.block_sparse_moe.shared_experts.gate_proj.weight";
const std::string kAttn = "language_model.model.layers.3.self_attn.q_proj.weight";
}  // namespace

TEST(Placement, RulesFirstMatchWinsElseTheModelDevice) {
  const Placement p = Placement::parse({"q_proj=CPU", "layers\\.3\\.=CUDA1", "self_attn=cuda:2"}, false, 0);
  EXPECT_EQ(p.device_of(kAttn, 0), kHostDevice);  // first rule
  EXPECT_EQ(p.device_of(kExpert, 0), 1);          // second
  EXPECT_EQ(p.device_of("language_model.model.layers.4.self_attn.o_proj.weight", 0), 2);
  EXPECT_EQ(p.device_of("language_model.model.embed_tokens.weight", 0), 0);  // none: the model's device
  EXPECT_FALSE(p.only_host());
  EXPECT_TRUE(Placement::parse({}, false, 0).empty());
}

TEST(Placement, CpuMoeTakesRoutedExpertsOnly) {
  const Placement p = Placement::parse({}, true, 0);
  EXPECT_EQ(p.device_of(kExpert, 0), kHostDevice);
  EXPECT_EQ(p.device_of(kShared, 0), 0);
  EXPECT_EQ(p.device_of(kAttn, 0), 0);
  EXPECT_TRUE(p.only_host());
}

TEST(Placement, NCpuMoeTakesTheFirstNLayers) {
  const Placement p = Placement::parse({}, false, 2);
  auto expert = [](int l) { return "m.layers." + std::to_string(l) + ".block_sparse_moe.experts.0.w2.weight"; };
  EXPECT_EQ(p.device_of(expert(0), 0), kHostDevice);
  EXPECT_EQ(p.device_of(expert(1), 0), kHostDevice);
  EXPECT_EQ(p.device_of(expert(2), 0), 0);
  EXPECT_EQ(p.device_of(expert(10), 0), 0);  // "layers.1" is not a prefix match of "layers.10"
  EXPECT_EQ(p.device_of(expert(11), 0), 0);
}

// A huge N is a number comparison, not a pattern of N alternatives (that once made a 600 KB error line).
TEST(Placement, NCpuMoeIsANumberComparison) {
  const Placement p = Placement::parse({}, false, 100000);
  EXPECT_EQ(p.device_of("m.layers.99999.block_sparse_moe.experts.0.w1.weight", 0), kHostDevice);
  EXPECT_EQ(p.device_of("m.layers.100000.block_sparse_moe.experts.0.w1.weight", 0), 0);
  EXPECT_EQ(p.device_of("m.layers.12345678901234.block_sparse_moe.experts.0.w1.weight", 0), 0);
  ASSERT_EQ(p.describe().size(), 1u);
  EXPECT_LT(p.describe()[0].size(), 80u);
  // A long bad pattern is cut in the message.
  try {
    Placement::parse({std::string(5000, '(') + "=CPU"}, false, 0);
    ADD_FAILURE();
  } catch (const k3::Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
}

TEST(Placement, BadRulesAreClearErrors) {
  for (const char* bad : {"experts", "=CPU", "experts=", "exp(erts=CPU", "experts=TPU", "experts=cuda:x"}) {
    try {
      Placement::parse({bad}, false, 0);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const k3::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--override-tensor"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Placement::parse({}, false, -1), k3::Error);
}

// --cpu-moe on a real checkpoint: every routed-expert matrix has the host as its home, nothing else does.
TEST(Placement, BinderGivesEveryMatrixItsHome) {
  const std::string dir = k3test::source_path("tests/data/tiny-k3");
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  const Placement p = Placement::parse({}, true, 0);
  const k3::ModelWeights w = k3::bind_weights(c, ck, &p, 0);
  int64_t experts = 0, others = 0;
  for (const k3::LayerWeights& L : w.layers) {
    if (!L.is_moe) continue;
    for (const k3::GluMlp& e : L.moe.experts)
      for (const k3::WeightMatrix* m : {&e.gate, &e.up, &e.down}) experts += m->device == kHostDevice;
    EXPECT_EQ(L.moe.shared.gate.device, 0);
    EXPECT_EQ(L.moe.router.device, 0);
  }
  k3::for_each_matrix(w, [&](const k3::WeightMatrix& m) { others += !m.empty() && m.device == 0; });
  EXPECT_EQ(experts, 3 * c.num_experts * (c.num_layers - 1));  // tiny-k3: layer 0 is dense
  EXPECT_GT(others, 0);
  EXPECT_GT(k3::matrix_bytes_on(w, kHostDevice), 0);
  EXPECT_EQ(k3::matrix_bytes_on(w, kHostDevice) + k3::matrix_bytes_on(w, 0), [&] {
    int64_t b = 0;
    k3::for_each_matrix(w, [&](const k3::WeightMatrix& m) { b += m.empty() ? 0 : m.bytes(); });
    return b;
  }());
}
