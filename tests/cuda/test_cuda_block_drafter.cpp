// The block drafter on the GPU (docs/block-drafter.md):
//  - its kernels (block attention, strided / broadcast row copies) against the CPU backend's on random inputs;
//  - taps (ForwardOptions::tap_layers) of the CUDA forward against the CPU forward's on k3-tiny: a prompt in
//    the prefill form, decode steps (captured as CUDA graphs from the second one: a step with taps is its
//    own graph), a verification step (several logits rows) through forward_sample;
//  - the drafter's logits on the GPU (cuda_drafter.h: the same graph over the CUDA backend) against the CPU's;
//  - the engine with the drafter (on the GPU) on == off on CUDA, greedy, batched, both rollbacks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>

#include "cuda_test_util.h"
#include "drafter_test_util.h"
#include "engine_test_request.h"
#include "k3/backend/cpu/block_attention.h"
#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cuda/cuda_drafter.h"
#include "k3/backend/cuda/cuda_model.h"
#include "k3/backend/cuda/drafter_kernels.h"
#include "k3/engine/batch_engine.h"
#include "k3/model/drafter/block_drafter.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"
#include "test_util.h"
#include "output_collector.h"

namespace {

using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::randn;
using k3cudatest::rel_err;

TEST(CudaBlockDrafterKernels, BlockAttentionMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const auto [block, heads, hd] : {std::array<int, 3>{1, 2, 16}, {7, 3, 32}, {8, 4, 64}, {8, 2, 128}}) {
    const int64_t N = static_cast<int64_t>(block) * 9, C = static_cast<int64_t>(heads) * hd;
    const auto q = randn(size_t(N * C), 1, 1.5f), k = randn(q.size(), 2, 1.5f), v = randn(q.size(), 3);
    std::vector<float> want(q.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    k3::cpu::block_attention(q.data(), k.data(), v.data(), N, block, heads, hd, scale, want.data());
    Dev<float> dq(q), dk(k), dv(v), dout(q.size());
    dout.poison();
    ck(k3::cuda::block_attention(dq.p, dk.p, dv.p, N, block, heads, hd, scale, dout.p, nullptr), "block_attention");
    ck(cudaDeviceSynchronize(), "sync");
    EXPECT_LT(rel_err(dout.get(), want), 1e-5) << block << " " << heads << " " << hd;  // fp32 vs float64 sums
  }
  Dev<float> x(64);
  EXPECT_NE(k3::cuda::block_attention(x.p, x.p, x.p, 5, 2, 1, 8, 1.f, x.p, nullptr), cudaSuccess);  // 5 % 2
  cudaGetLastError();
}

// argmax_rows against std::max_element: widths around the block's 256 threads and a vocabulary's, rows
// whose maximum is repeated (the lowest index must win), -inf rows, a maximum in the last column.
TEST(CudaBlockDrafterKernels, ArgmaxRowsIsMaxElement) {
  SKIP_WITHOUT_GPU();
  for (const int64_t V : {int64_t{1}, int64_t{31}, int64_t{257}, int64_t{4099}, int64_t{163840}}) {
    const int64_t rows = 6;
    auto x = randn(size_t(rows * V), static_cast<uint32_t>(V), 2.f);
    auto at = [&](int64_t r, int64_t i) -> float& { return x[size_t(r * V + i)]; };
    if (V > 2) {
      at(1, V - 1) = 100.f;                       // maximum in the last column
      at(2, V / 3) = at(2, V / 2) = at(2, V - 2) = 50.f;  // ties: the lowest wins
      for (int64_t i = 0; i < V; ++i) at(3, i) = -INFINITY;
      for (int64_t i = 0; i < V; ++i) at(4, i) = 1.f;     // all equal: 0
    }
    Dev<float> dx(x);
    Dev<int32_t> ids(static_cast<size_t>(rows));
    ck(k3::cuda::argmax_rows(dx.p, rows, V, ids.p, nullptr), "argmax_rows");
    ck(cudaDeviceSynchronize(), "sync");
    const auto got = ids.get();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * V;
      EXPECT_EQ(got[size_t(r)], std::max_element(row, row + V) - row) << "V " << V << " row " << r;
    }
  }
}

TEST(CudaBlockDrafterKernels, CopyRowsStridedAndBroadcast) {
  SKIP_WITHOUT_GPU();
  const auto src = randn(6 * 40, 5);
  Dev<float> dsrc(src), ddst(10 * 40);
  ddst.poison();
  // Columns 1..5 of 40 rows 6 floats apart -> columns 2..6 of rows 10 floats apart.
  ck(k3::cuda::copy_rows(ddst.p + 2, 10, dsrc.p + 1, 6, 40, 5, nullptr), "copy_rows");
  ck(k3::cuda::copy_rows(ddst.p + 7, 10, dsrc.p, 0, 40, 3, nullptr), "broadcast");  // stride 0: row 0 everywhere
  const auto got = ddst.get();
  for (int r = 0; r < 40; ++r) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(got[size_t(r * 10 + 2 + c)], src[size_t(r * 6 + 1 + c)]) << r << "," << c;
    for (int c = 0; c < 3; ++c) EXPECT_EQ(got[size_t(r * 10 + 7 + c)], src[size_t(c)]) << r << "," << c;
    EXPECT_TRUE(std::isnan(got[size_t(r * 10)])) << "a column outside the view was written";
  }
}

struct Pair {
  std::unique_ptr<k3::Model> cpu;
  std::unique_ptr<k3::cuda::CudaModel> gpu;
};

std::vector<int32_t> all_tap_ids(const k3::ModelConfig& c) {
  std::vector<int32_t> ids;
  for (int32_t l = c.num_layers; l >= 0; l -= 3) ids.push_back(l);  // 12, 9, 6, 3, 0: final first, out of order
  return ids;
}

TEST(CudaBlockDrafterTaps, MatchTheCpuInPrefillDecodeGraphsAndVerification) {
  SKIP_WITHOUT_GPU();
  const std::string dir = k3test::source_path("models/k3-tiny");
  Pair p{k3::Model::load(dir), k3::cuda::CudaModel::load(dir)};
  const auto& c = p.cpu->config();
  const std::vector<int32_t> ids = all_tap_ids(c);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>((7919 * i + 31) % c.vocab_size));
  auto cc = p.cpu->new_cache(), gc = p.gpu->new_cache();
  auto step = [&](const k3::ModelRunner& m, k3::SequenceCache& cache, const std::vector<int32_t>& toks, int64_t rows) {
    std::vector<float> logits, taps;
    k3::ForwardOptions fo;
    fo.tap_layers = ids;
    fo.taps = &taps;
    k3::BatchItem it{toks, &cache, true};
    it.n_logit_rows = rows;
    m.forward_batch({it}, logits, fo);
    return taps;
  };
  double worst = 0;
  auto compare = [&](const std::vector<float>& g, const std::vector<float>& r, const char* what) {
    const double e = rel_err(g, r);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-3) << what;  // the GPU's GEMMs vs the CPU's (logits agree to 1e-3 in test_cuda_model)
  };
  compare(step(*p.gpu, *gc, prompt, 1), step(*p.cpu, *cc, prompt, 1), "prefill");
  const int64_t replays0 = p.gpu->graph_replays();
  for (int i = 0; i < 6; ++i) {
    const std::vector<int32_t> t{static_cast<int32_t>(100 + 37 * i)};
    compare(step(*p.gpu, *gc, t, 1), step(*p.cpu, *cc, t, 1), "decode");
  }
  EXPECT_GE(p.gpu->graph_replays() - replays0, 4) << "decode steps with taps should replay a captured graph";
  // A verification-shaped step (4 tokens, 4 logits rows) through forward_sample.
  const std::vector<int32_t> v{11, 12, 13, 14};
  std::vector<k3::RowSample> rows(4);
  for (auto& r : rows) r.sampling.temperature = 0.f;
  std::vector<k3::sampling::SampleResult> res;
  std::vector<float> raw, gtaps;
  k3::ForwardOptions fo;
  fo.tap_layers = ids;
  fo.taps = &gtaps;
  k3::BatchItem it{v, gc.get(), true};
  it.n_logit_rows = 4;
  p.gpu->forward_sample({it}, rows, res, raw, fo);
  compare(gtaps, step(*p.cpu, *cc, v, 4), "verification");
  std::printf("[ taps ] cuda vs cpu, k3-tiny, tap ids 12/9/6/3/0: worst rel %.3e\n", worst);
}

TEST(CudaBlockDrafter, LogitsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::string dir = k3test::source_path("models/k3-tiny");
  const auto cfg = k3::load_model_config(dir);
  const auto files = k3test::write_random_drafter(cfg, {}, 77);
  const auto cpu = k3::drafter::BlockDrafter::load(files->path(), dir);
  auto gpu = k3::drafter::BlockDrafter::load(files->path(), dir);
  gpu->set_runner(k3::cuda::make_cuda_drafter_runner(gpu->config(), gpu->weights(), 0));
  EXPECT_EQ(gpu->device_name(), "cuda:0");
  const auto target = k3::cuda::CudaModel::load(dir);
  auto gpu_shared = k3::drafter::BlockDrafter::load(files->path(), dir);
  gpu_shared->set_runner(k3::cuda::make_cuda_drafter_runner(gpu_shared->config(), gpu_shared->weights(), 0,
                                                            &target->device_weights()));
  EXPECT_EQ(gpu_shared->device_name(), "cuda:0 (the target's embedding and lm_head)");
  const int64_t R = 5, D = cpu->config().ctx_dim();
  const auto ctx = randn(size_t(R * D), 8, 1.f);
  std::vector<int32_t> last;
  for (int64_t r = 0; r < R; ++r) last.push_back(static_cast<int32_t>((811 * r + 5) % cfg.vocab_size));
  for (const int64_t n_out : {int64_t{8}, int64_t{3}}) {
    std::vector<float> want, got;
    cpu->forward(ctx, last, n_out, want);
    gpu->forward(ctx, last, n_out, got);
    const double e = rel_err(got, want);
    std::printf("[ drafter ] cuda vs cpu logits, R %lld, n_out %lld: rel %.3e\n", (long long)R, (long long)n_out, e);
    EXPECT_LT(e, 1e-3);  // fp32 GEMMs on bf16 weights both sides, different kernels
    std::vector<int32_t> dg, dc;
    gpu->draft(ctx, last, n_out, dg);
    cpu->draft(ctx, last, n_out, dc);
    int64_t same = 0;
    for (size_t i = 0; i < dg.size(); ++i) same += dg[i] == dc[i];
    EXPECT_GE(same, static_cast<int64_t>(dg.size()) - 1) << "argmax differs beyond a near-tie";
    // Sharing the target's device copies of the embedding and lm_head (CudaModel::device_weights) instead of
    // uploading them: the same bytes through the same kernels, so the same logits bit for bit.
    std::vector<float> shared;
    gpu_shared->forward(ctx, last, n_out, shared);
    ASSERT_EQ(shared.size(), got.size());
    EXPECT_EQ(std::memcmp(shared.data(), got.data(), got.size() * sizeof(float)), 0);
    // The device's argmax (draft_ids) is exactly the host's over the same device logits.
    ASSERT_EQ(dg.size(), got.size() / static_cast<size_t>(cfg.vocab_size));
    for (size_t i = 0; i < dg.size(); ++i) {
      const float* row = got.data() + i * static_cast<size_t>(cfg.vocab_size);
      EXPECT_EQ(dg[i], std::max_element(row, row + cfg.vocab_size) - row) << "row " << i;
    }
  }
}

// The drafter's steps replay captured CUDA graphs from the second one of a shape: every call with new
// context rows and tokens must give the eager runner's logits and drafts bit for bit (a graph that baked
// in the first call's inputs, or missed the argmax, would not).
TEST(CudaBlockDrafter, GraphReplaysEqualEagerSteps) {
  SKIP_WITHOUT_GPU();
  const std::string dir = k3test::source_path("models/k3-tiny");
  const auto cfg = k3::load_model_config(dir);
  const auto files = k3test::write_random_drafter(cfg, {}, 91);
  auto graphs = k3::drafter::BlockDrafter::load(files->path(), dir);
  graphs->set_runner(k3::cuda::make_cuda_drafter_runner(graphs->config(), graphs->weights(), 0));
  setenv("K3_DRAFTER_GRAPHS", "0", 1);
  auto eager = k3::drafter::BlockDrafter::load(files->path(), dir);
  eager->set_runner(k3::cuda::make_cuda_drafter_runner(eager->config(), eager->weights(), 0));
  unsetenv("K3_DRAFTER_GRAPHS");
  const int64_t D = graphs->config().ctx_dim();
  for (int call = 0; call < 5; ++call)
    for (const int64_t R : {int64_t{1}, int64_t{3}}) {
      const auto ctx = randn(size_t(R * D), 100 + call, 1.f);
      std::vector<int32_t> last;
      for (int64_t r = 0; r < R; ++r) last.push_back(static_cast<int32_t>((613 * r + 97 * call + 11) % cfg.vocab_size));
      std::vector<float> a, b;
      graphs->forward(ctx, last, 4, a);
      eager->forward(ctx, last, 4, b);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "call " << call << " R " << R;
      std::vector<int32_t> da, db;
      graphs->draft(ctx, last, 4, da);
      eager->draft(ctx, last, 4, db);
      EXPECT_EQ(da, db) << "call " << call << " R " << R;
    }
}

using Collector = k3test::OutputCollector;

TEST(CudaBlockDrafterEngine, GreedyEqualsNoSpeculation) {
  SKIP_WITHOUT_GPU();
  const std::string dir = k3test::source_path("models/k3-tiny");
  auto m = k3::cuda::CudaModel::load(dir);
  const auto tok = k3::text::Tokenizer::load(dir);
  const auto files = k3test::write_random_drafter(m->config(), {}, 2024);
  const auto drafter = k3::drafter::BlockDrafter::load(files->path(), dir);
  drafter->set_runner(k3::cuda::make_cuda_drafter_runner(drafter->config(), drafter->weights(), 0));
  std::vector<k3::engine::Request> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p{static_cast<int32_t>(m->config().bos_token_id)};
    const auto t = tok.encode(std::string("def f") + std::to_string(i) + "(a, b):\n    return a + b\n\ndef g(x):\n" +
                              std::string(static_cast<size_t>(i) * 7, 'x'));
    p.insert(p.end(), t.begin(), t.end());
    reqs.push_back(k3test::make_request("r" + std::to_string(i), p, 24 + 8 * i));
  }
  auto run = [&](std::optional<k3::engine::SpeculativeConfig> spec, k3::engine::EngineStats* st) {
    k3::engine::BatchEngineOptions o;
    o.cache.budget_bytes = 256ll << 20;
    o.sched.max_num_seqs = 8;
    o.sched.max_num_batched_tokens = 256;
    o.speculative = spec;
    o.block_drafter = drafter.get();
    k3::engine::BatchEngine eng(*m, tok, o);
    Collector c;
    for (const auto& r : reqs) eng.submit(r, c.cb());
    c.wait(static_cast<int>(reqs.size()));
    eng.shutdown(true);
    if (st) *st = eng.stats();
    return c.ids;
  };
  const auto off = run(std::nullopt, nullptr);
  for (const auto rb : {k3::engine::SpeculativeConfig::Rollback::Snapshots, k3::engine::SpeculativeConfig::Rollback::Replay}) {
    k3::engine::SpeculativeConfig sc;
    sc.method = "block_drafter";
    sc.model = files->path();
    sc.num_speculative_tokens = 5;
    sc.rollback = rb;
    k3::engine::EngineStats st;
    const auto on = run(sc, &st);
    for (const auto& r : reqs) EXPECT_EQ(on.at(r.id), off.at(r.id)) << r.id;
    EXPECT_GT(st.spec_num_drafts, 0);
    std::printf("[ spec ] cuda k3-tiny, random block drafter: %lld drafts, %lld of %lld draft tokens accepted\n",
                static_cast<long long>(st.spec_num_drafts), static_cast<long long>(st.spec_num_accepted_tokens),
                static_cast<long long>(st.spec_num_draft_tokens));
  }
}

}  // namespace
