// --load-format dummy's checkpoint (model/dummy_checkpoint.h): the tensor list of a real HF directory (names,
// shapes, dtypes), weights that bind and run, the same seed giving the same model, and tensor parallel over it
// agreeing with the one-process model (every rank draws the same pools and shards them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>

#include "k3/dist/tp_model.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/dummy_checkpoint.h"
#include "k3/model/model.h"
#include "test_util.h"
#include "thread_comm.h"

namespace {

std::vector<float> run(const k3::ModelRunner& m, const std::vector<int32_t>& toks) {
  auto st = m.new_cache();
  std::vector<float> logits;
  m.forward(toks, *st, logits);
  return logits;
}

const std::vector<int32_t> kToks = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};

// Every text-model tensor of the real checkpoint is in the dummy one with its shape and dtype, and nothing else is
// (A_log may take another of the shapes the binder accepts: K3 stores it zero-padded).
TEST(DummyCheckpoint, MatchesTheRealTensorList) {
  for (const char* d : {"tests/data/tiny-k3", "tests/data/tiny-kimi-linear", "models/k3-tiny"}) {
    const std::string dir = k3test::source_path(d);
    const k3::ModelConfig c = k3::load_model_config(dir);
    const k3::Checkpoint real(dir);
    const k3::ModelFiles dummy = k3::dummy_model_files(c);
    size_t text = 0;
    for (const auto& [name, t] : real.all()) {
      if (name.rfind(c.tensor_prefix, 0) != 0 && name != c.lm_head_name) continue;  // vision tower etc.
      ++text;
      const k3::TensorInfo* u = dummy.checkpoint->find(name);
      ASSERT_NE(u, nullptr) << d << ": no dummy '" << name << "'";
      EXPECT_EQ(u->dtype, t->dtype) << d << " " << name;
      if (name.find("A_log") == std::string::npos) {
        EXPECT_EQ(u->shape, t->shape) << d << " " << name;
      }
      EXPECT_EQ(u->nbytes, static_cast<size_t>(u->numel()) * k3::dtype_size(u->dtype)) << name;
    }
    EXPECT_EQ(dummy.checkpoint->all().size(), text) << d << ": the dummy has tensors the real one has not";
    EXPECT_GT(text, 20u);
  }
}

// The dummy binds and runs; the same seed gives the same logits, another seed others; the logits are finite
// and not flat (the views carry real values).
TEST(DummyCheckpoint, BindsRunsAndIsDeterministic) {
  const k3::ModelConfig c = k3::load_model_config(k3test::source_path("tests/data/tiny-k3"));
  auto a = k3::Model::load(k3::dummy_model_files(c, 7)), b = k3::Model::load(k3::dummy_model_files(c, 7)),
       o = k3::Model::load(k3::dummy_model_files(c, 8));
  const auto la = run(*a, kToks), lb = run(*b, kToks), lo = run(*o, kToks);
  ASSERT_EQ(la.size(), static_cast<size_t>(c.vocab_size));
  EXPECT_EQ(la, lb);
  EXPECT_NE(la, lo);
  float mn = la[0], mx = la[0];
  for (float x : la) {
    ASSERT_TRUE(std::isfinite(x));
    mn = std::min(mn, x), mx = std::max(mx, x);
  }
  EXPECT_GT(mx - mn, 1e-3f);
}

// TP2 over two thread ranks, each drawing the dummy itself, against the one-process dummy model: the same model
// sharded (so logits within the split-sum bound and the same argmax), also for a slice with no MLA layer (the
// workers' cache check used to want an MLA row size rank 0 does not send then).
void tp2_matches(k3::ModelConfig c) {
  auto group = std::make_shared<k3test::ThreadGroup>(2);
  k3::dist::TpLoadOptions opt;
  opt.print_plan = false;
  opt.dummy = c;
  std::string worker_error;
  std::thread worker([&] {
    try {
      auto m = k3::dist::TpModel::load("", std::make_unique<k3test::ThreadComm>(group, 1), opt);
      m->run_worker();
    } catch (const std::exception& e) {
      worker_error = e.what();
    }
  });
  double max_rel = 0;
  bool same_argmax = false;
  try {
    auto tp = k3::dist::TpModel::load("", std::make_unique<k3test::ThreadComm>(group, 0), opt);
    auto ref = k3::Model::load(k3::dummy_model_files(c));
    const auto la = run(*tp, kToks), lr = run(*ref, kToks);
    ASSERT_EQ(la.size(), lr.size());
    double d = 0, m = 0;
    for (size_t i = 0; i < lr.size(); ++i) {
      d = std::max(d, static_cast<double>(std::fabs(la[i] - lr[i])));
      m = std::max(m, static_cast<double>(std::fabs(lr[i])));
    }
    max_rel = d / m;
    same_argmax = std::max_element(la.begin(), la.end()) - la.begin() == std::max_element(lr.begin(), lr.end()) - lr.begin();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 0: " << e.what();
  }
  worker.join();
  EXPECT_EQ(worker_error, "");
  EXPECT_TRUE(same_argmax);
  EXPECT_LT(max_rel, 1e-4);
  EXPECT_GT(max_rel, 0.0);  // the sums really were split
}

TEST(DummyCheckpoint, TensorParallelOverTheDummyMatchesOneProcess) {
  tp2_matches(k3::load_model_config(k3test::source_path("tests/data/tiny-k3")));
  k3::ModelConfig kda_only = k3::load_model_config(k3test::source_path("tests/data/tiny-k3"));
  kda_only.num_layers = 3;  // layers 1-3 of 8: KDA (the first dense), no MLA
  kda_only.is_kda.resize(3);
  ASSERT_EQ(kda_only.num_mla_layers(), 0);
  tp2_matches(kda_only);
}

}  // namespace

namespace {

// Max |a - b| / max |b| over the rows both hold.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    md = std::max(md, std::fabs(static_cast<double>(a[i]) - b[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(b[i])));
  }
  return md / std::max(mr, 1e-30);
}

// A model without MLA layers (Kimi-Linear cut to its first two layers, both KDA; the CUDA backend crashed on one in
// session 39): a prefill of 32 then 8 decoded tokens gives the logits one prefill of the 40 gives.
TEST(DummyCheckpoint, KdaOnlyModelPrefillThenDecodeMatchesPrefill) {
  k3::ModelConfig c = k3::load_model_config(k3test::source_path("tests/data/tiny-kimi-linear"));
  c.num_layers = 2;
  c.is_kda.assign(2, true);
  ASSERT_EQ(c.num_mla_layers(), 0);
  auto m = k3::Model::load(k3::dummy_model_files(c, 3));
  std::vector<int32_t> toks(40);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(c.vocab_size));
  k3::ForwardOptions all;
  all.all_logits = true;
  std::vector<float> whole, part, one;
  auto s1 = m->new_cache();
  m->forward(toks, *s1, whole, all);
  auto s2 = m->new_cache();
  m->forward(std::span<const int32_t>(toks.data(), 32), *s2, part, all);
  for (size_t t = 32; t < toks.size(); ++t) {
    m->forward(std::span<const int32_t>(&toks[t], 1), *s2, one);
    part.insert(part.end(), one.begin(), one.end());
  }
  ASSERT_EQ(part.size(), whole.size());
  EXPECT_LT(rel_diff(part, whole), 1e-4);
}

}  // namespace
