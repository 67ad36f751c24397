// Importance matrices (model/imatrix.h): what the collector accumulates against a float64 recomputation
// from the same inputs, counts per matrix and expert, the GGUF file's round trip and validation, and the
// quantiser reading it (k3 convert --imatrix).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <tuple>

#include "k3/core/error.h"
#include "k3/io/gguf_writer.h"
#include "k3/model/gguf_export.h"
#include "k3/model/imatrix.h"
#include "k3/model/model.h"
#include "test_util.h"

namespace {
const std::string kTiny = "tests/data/tiny-k3";
}

// Run the tiny K3 over T tokens with the collector: every dense blk matrix saw T rows, every MoE layer's
// experts T x top_k rows in total; and the sums of one matrix equal a float64 recomputation from the inputs
// a second observer recorded during the same run.
TEST(Imatrix, CollectsSquaredInputsPerMatrixAndExpert) {
  auto m = k3::Model::load(k3test::source_path(kTiny));
  const auto& c = m->config();
  struct Tee : k3::cpu::ActivationObserver {
    k3::ImatrixCollector* col;
    const void* watch = nullptr;
    std::vector<double> ref;
    void on_linear_input(const k3::WeightMatrix& W, const float* x, int64_t n) override {
      col->on_linear_input(W, x, n);
      if (W.data != watch) return;
      ref.resize(static_cast<size_t>(W.cols), 0.0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < W.cols; ++k) ref[static_cast<size_t>(k)] += double(x[r * W.cols + k]) * x[r * W.cols + k];
    }
    void on_expert_inputs(const k3::MoeWeights& w, int64_t e, const float* x, const float* h, int64_t n) override {
      col->on_expert_inputs(w, e, x, h, n);
    }
  };
  k3::ImatrixCollector col(c, m->weights(), m->checkpoint());
  ASSERT_GT(col.matrices_named(), 0);
  Tee tee;
  tee.col = &col;
  int64_t L0 = 0;
  while (!m->weights().layers[static_cast<size_t>(L0)].is_kda) ++L0;
  tee.watch = m->weights().layers[static_cast<size_t>(L0)].kda.q.data;  // a KDA projection
  m->set_activation_observer(&tee);
  const std::vector<int32_t> toks = {3, 99, 400, 7, 12, 800, 5, 64, 33};
  std::vector<float> logits;
  auto st = m->new_cache();
  m->forward(toks, *st, logits);
  m->set_activation_observer(nullptr);
  const k3::Imatrix& im = col.result();
  const int64_t T = static_cast<int64_t>(toks.size());
  int64_t dense = 0, moe = 0;
  for (const auto& [name, e] : im.entries) {
    EXPECT_EQ(name.rfind("blk.", 0), 0u) << name;
    double total = 0;
    for (double n : e.counts) total += n;
    if (e.counts.size() == 1) {
      ++dense;
      EXPECT_EQ(total, T) << name;
    } else {
      ++moe;
      EXPECT_EQ(static_cast<int64_t>(e.counts.size()), c.num_experts) << name;
      EXPECT_EQ(total, T * c.top_k) << name;
    }
  }
  EXPECT_GT(dense, 0);
  EXPECT_GT(moe, 0);
  const std::string qname = "blk." + std::to_string(L0) + ".attn_q.weight";
  ASSERT_TRUE(im.entries.count(qname)) << "no entry " << qname;
  const auto& e = im.entries.at(qname);
  ASSERT_EQ(e.in_sum2.size(), tee.ref.size());
  for (size_t k = 0; k < e.in_sum2.size(); ++k) EXPECT_NEAR(e.in_sum2[k], tee.ref[k], 1e-9 * (1 + tee.ref[k]));
  double sum = 0;
  for (double v : e.in_sum2) sum += v;
  EXPECT_GT(sum, 0.0);  // never on zeros
}

// kv_b in llama.cpp's graph is two per-head stacks: attn_k_b multiplies each head's q_nope, attn_v_b each head's
// attention output in latent space. Run in the decode forms (what `k3 imatrix` does), the collector gives each an
// entry with one matrix per head, T rows per head, and sums equal to a float64 recomputation from the queries and
// latent outputs the absorbed form reported (q_nope: the first nope values of each head's qk, not the rope part).
// A prefill-form run (the MHA form never forms them) leaves both out.
TEST(Imatrix, KvbHalvesPerHeadFromTheAbsorbedForm) {
  auto m = k3::Model::load(k3test::source_path(kTiny));
  const auto& c = m->config();
  struct Tee : k3::cpu::ActivationObserver {
    k3::ImatrixCollector* col;
    const k3::MlaWeights* watch = nullptr;
    std::vector<double> kb, vb;  // [head][nope], [head][rank]
    void on_mla_absorbed(const k3::MlaWeights& w, const k3::graph::MlaDims& d, const float* q, const float* ol,
                         std::span<const int64_t> rows) override {
      col->on_mla_absorbed(w, d, q, ol, rows);
      if (&w != watch) return;
      kb.resize(static_cast<size_t>(d.heads * d.nope), 0.0);
      vb.resize(static_cast<size_t>(d.heads * d.rank), 0.0);
      for (const int64_t r : rows)
        for (int64_t h = 0; h < d.heads; ++h) {
          for (int64_t i = 0; i < d.nope; ++i) {
            const double x = q[(r * d.heads + h) * d.qk() + i];
            kb[static_cast<size_t>(h * d.nope + i)] += x * x;
          }
          for (int64_t i = 0; i < d.rank; ++i) {
            const double x = ol[(r * d.heads + h) * d.rank + i];
            vb[static_cast<size_t>(h * d.rank + i)] += x * x;
          }
        }
    }
  };
  int64_t L = 0;
  while (m->weights().layers[static_cast<size_t>(L)].is_kda) ++L;  // the first MLA layer
  const std::vector<int32_t> toks = {3, 99, 400, 7, 12, 800, 5, 64, 33, 250, 1};
  const int64_t T = static_cast<int64_t>(toks.size());
  for (const k3::AttnPath path : {k3::AttnPath::Decode, k3::AttnPath::Prefill}) {
    k3::ImatrixCollector col(c, m->weights(), m->checkpoint());
    Tee tee;
    tee.col = &col;
    tee.watch = &m->weights().layers[static_cast<size_t>(L)].mla;
    m->set_activation_observer(&tee);
    k3::ForwardOptions opt;
    opt.path = path;
    std::vector<float> logits;
    auto st = m->new_cache();
    m->forward(toks, *st, logits, opt);
    m->set_activation_observer(nullptr);
    const k3::Imatrix& im = col.result();
    const std::string kn = "blk." + std::to_string(L) + ".attn_k_b.weight", vn = "blk." + std::to_string(L) + ".attn_v_b.weight";
    if (path == k3::AttnPath::Prefill) {
      EXPECT_FALSE(im.entries.count(kn) || im.entries.count(vn)) << "the MHA form has no per-head kv_b inputs";
      continue;
    }
    ASSERT_TRUE(im.entries.count(kn) && im.entries.count(vn)) << kn;
    for (const auto& [name, ref, cols] : {std::tuple{kn, &tee.kb, c.qk_nope_dim}, std::tuple{vn, &tee.vb, c.kv_lora_rank}}) {
      const k3::ImatrixEntry& e = im.entries.at(name);
      EXPECT_EQ(e.cols, cols) << name;
      ASSERT_EQ(static_cast<int64_t>(e.counts.size()), c.mla_heads) << name;
      for (double n : e.counts) EXPECT_EQ(n, T) << name;
      ASSERT_EQ(e.in_sum2.size(), ref->size()) << name;
      double sum = 0;
      for (size_t k = 0; k < ref->size(); ++k) {
        EXPECT_NEAR(e.in_sum2[k], (*ref)[k], 1e-9 * (1 + (*ref)[k])) << name << " at " << k;
        sum += (*ref)[k];
      }
      EXPECT_GT(sum, 0.0) << name;  // never on zeros
    }
  }
}

TEST(Imatrix, FileRoundTripAndValidation) {
  k3::Imatrix im;
  im.datasets = {"calib.txt"};
  im.chunk_count = 3;
  im.chunk_size = 512;
  im.entries["blk.0.attn_q.weight"] = {4, {1, 2, 3, 4}, {2}};
  im.entries["blk.1.ffn_gate_exps.weight"] = {2, {1, 1, 0, 0, 5, 7}, {1, 0, 4}};
  k3test::TempDir t;
  const std::string p = t.str() + "/i.gguf";
  k3::write_imatrix(im, p);
  const k3::Imatrix r = k3::read_imatrix(p);
  EXPECT_EQ(r.datasets, im.datasets);
  EXPECT_EQ(r.chunk_count, 3);
  EXPECT_EQ(r.chunk_size, 512);
  ASSERT_EQ(r.entries.size(), 2u);
  EXPECT_EQ(r.entries.at("blk.1.ffn_gate_exps.weight").in_sum2, im.entries["blk.1.ffn_gate_exps.weight"].in_sum2);
  EXPECT_EQ(r.importance("blk.0.attn_q.weight", 0, 4), (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
  EXPECT_TRUE(r.importance("blk.1.ffn_gate_exps.weight", 1, 2).empty());  // an expert nothing reached
  EXPECT_EQ(r.importance("blk.1.ffn_gate_exps.weight", 2, 2), (std::vector<float>{1.25f, 1.75f}));
  EXPECT_TRUE(r.importance("blk.0.attn_q.weight", 0, 8).empty());  // another width: not this matrix
  // Not an imatrix: a GGUF without general.type = imatrix; a sum without its counts; a negative count.
  k3::GgufWriter w;
  w.set_string("general.type", "model");
  w.write(t.str() + "/m.gguf");
  EXPECT_THROW(k3::read_imatrix(t.str() + "/m.gguf"), k3::Error);
  k3::GgufWriter w2;
  w2.set_string("general.type", "imatrix");
  w2.add_tensor("blk.0.x.weight.in_sum2", {2, 1}, 0, [](k3::GgufSink& s) { const float v[2] = {1, 2}; s.write(v, 8); });
  w2.write(t.str() + "/n.gguf");
  EXPECT_THROW(k3::read_imatrix(t.str() + "/n.gguf"), k3::Error);
  k3::Imatrix bad = im;
  bad.entries["blk.0.attn_q.weight"].counts = {-1};
  k3::write_imatrix(bad, t.str() + "/b.gguf");
  EXPECT_THROW(k3::read_imatrix(t.str() + "/b.gguf"), k3::Error);
}

// The exporter weights the quantiser by the imatrix: a matrix with importance gets other (weighted) blocks
// than without, and the count of weighted matrices is reported.
TEST(Imatrix, ConvertUsesItsWeights) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  auto m = k3::Model::load(dir);
  k3::ImatrixCollector col(m->config(), m->weights(), m->checkpoint());
  m->set_activation_observer(&col);
  std::vector<float> logits;
  auto st = m->new_cache();
  std::vector<int32_t> toks;
  for (int i = 0; i < 64; ++i) toks.push_back((i * 131 + 7) % static_cast<int32_t>(m->config().vocab_size));
  m->forward(toks, *st, logits);
  m->set_activation_observer(nullptr);
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  k3test::TempDir t;
  std::vector<k3::TensorTypeRule> rules = {k3::parse_tensor_type_rule("attn_q_a=q4_k")};
  k3::GgufWriter a, b;
  const auto sa = k3::add_model_to_gguf(a, c, ck, "x", rules);
  const auto sb = k3::add_model_to_gguf(b, c, ck, "x", rules, &col.result());
  EXPECT_EQ(sa.with_importance, 0);
  EXPECT_EQ(sb.with_importance, sb.quantised);
  EXPECT_GT(sb.quantised, 0);
  a.write(t.str() + "/a.gguf");
  b.write(t.str() + "/b.gguf");
  std::ifstream fa(t.str() + "/a.gguf", std::ios::binary), fb(t.str() + "/b.gguf", std::ios::binary);
  const std::string ba((std::istreambuf_iterator<char>(fa)), {}), bb((std::istreambuf_iterator<char>(fb)), {});
  ASSERT_EQ(ba.size(), bb.size());
  EXPECT_NE(ba, bb);  // the weighted search chose other blocks somewhere
}
