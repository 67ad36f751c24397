// Tensor / expert parallel pieces (src/k3/dist/): the shard plan's ranges and refusals, column slices of
// block formats, the step message, the mirrored cache memory, and the sharded model itself at 2 ranks
// as two threads of this process (thread_comm.h) against the one-process model. The same model over MPI
// processes: tests/mpi/tp_logits_check.cpp (CTest tp*_).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/dist/gpu_placement.h"
#include "k3/dist/memory_sequence.h"
#include "k3/dist/shard_plan.h"
#include "k3/dist/shard_weights.h"
#include "k3/dist/step_wire.h"
#include "k3/dist/tp_model.h"
#include "k3/model/config.h"
#include "k3/model/model.h"
#include "test_util.h"
#include "thread_comm.h"

namespace {

using k3::dist::Range;

k3::ModelConfig tiny_k3() { return k3::load_model_config(k3test::source_path("tests/data/tiny-k3")); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const k3::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShardPlan, SplitsHeadsColumnsExpertsAndVocab) {
  const k3::ModelConfig c = tiny_k3();  // KDA 2 heads, MLA 4, MLP 192, experts 16 x 64, 2 shared, V 1024
  const auto p = k3::dist::make_shard_plan(c, 1, 2, /*expert_parallel=*/false);
  EXPECT_EQ(p.kda.heads.first, 1);
  EXPECT_EQ(p.kda.heads.count, 1);
  EXPECT_EQ(p.mla.heads.first, 2);
  EXPECT_EQ(p.dense_inter.first, 96);
  EXPECT_EQ(p.shared_inter.count, 64);
  EXPECT_EQ(p.expert_inter.first, 32);
  EXPECT_EQ(p.experts.count, 16);  // TP: every expert, a slice of each
  EXPECT_EQ(p.vocab.first, 512);
  EXPECT_EQ(p.vocab_chunk, 512);
  const auto ep = k3::dist::make_shard_plan(c, 1, 2, /*expert_parallel=*/true);
  EXPECT_EQ(ep.experts.first, 8);
  EXPECT_EQ(ep.experts.count, 8);
  EXPECT_EQ(ep.expert_inter.count, 64);
  EXPECT_EQ(k3::dist::shard_config(c, p).kda_heads, 1);
  EXPECT_EQ(k3::dist::shard_config(c, p).mla_heads, 2);
}

TEST(ShardPlan, RefusesSizesThatDoNotDivideHeads) {
  const k3::ModelConfig c = tiny_k3();
  const std::string e = error_of([&] { k3::dist::make_shard_plan(c, 0, 3, false); });
  EXPECT_NE(e.find("--tensor-parallel-size 3 does not divide the KDA head count (2) and is no multiple of it; sizes "
                   "that work: the divisors 1, 2 and the multiples of 2"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of([&] { k3::dist::make_shard_plan(c, 0, 0, false); }).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of([&] { k3::dist::make_shard_plan(c, 2, 2, false); }).find("outside"), std::string::npos);
  k3::ModelConfig few = c;
  few.kda_heads = few.mla_heads = 32;
  few.intermediate_size = 32 * 64;
  few.moe_intermediate_size = 32 * 64;
  EXPECT_NE(error_of([&] { k3::dist::make_shard_plan(few, 0, 32, true); }).find("each rank needs at least one"),
            std::string::npos);
}

// Intermediate columns need not split evenly (the all-reduce is over the hidden size), but they split on
// quantisation blocks: k3-tiny's MXFP4 experts (96 = 3 x 32) at TP2 take 64 + 32.
TEST(ShardPlan, IntermediateSplitsOnWholeBlocks) {
  k3::ModelConfig c = tiny_k3();
  c.moe_intermediate_size = 96;
  const auto r0 = k3::dist::make_shard_plan(c, 0, 2, false), r1 = k3::dist::make_shard_plan(c, 1, 2, false);
  EXPECT_EQ(r0.expert_inter.count, 64);
  EXPECT_EQ(r1.expert_inter.first, 64);
  EXPECT_EQ(r1.expert_inter.count, 32);
  c.intermediate_size = 160;  // tiny-kimi-linear's MLP, in units of 32: 96 + 64
  const auto d1 = k3::dist::make_shard_plan(c, 1, 2, false);
  EXPECT_EQ(d1.dense_inter.first, 96);
  EXPECT_EQ(d1.dense_inter.count, 64);
  c.intermediate_size = 7;  // no block unit fits: column by column
  EXPECT_EQ(k3::dist::make_shard_plan(c, 1, 2, false).dense_inter.count, 3);
}

// More ranks than heads: each of tiny-k3's 2 KDA heads on 2 of 4 ranks, each replica keeping half of the
// head's 32 o_proj input channels; the 4 MLA heads one per rank.
TEST(ShardPlan, ReplicatesHeadsWhenRanksAreAMultiple) {
  const k3::ModelConfig c = tiny_k3();
  const auto p = k3::dist::make_shard_plan(c, 3, 4, true);
  EXPECT_EQ(p.kda.heads.first, 1);
  EXPECT_EQ(p.kda.heads.count, 1);
  EXPECT_EQ(p.kda.replicas, 2);
  EXPECT_EQ(p.kda.o_channels.first, 16);
  EXPECT_EQ(p.kda.o_channels.count, 16);
  EXPECT_EQ(p.mla.heads.first, 3);
  EXPECT_EQ(p.mla.replicas, 1);
  EXPECT_EQ(p.mla.o_channels.count, 16);
}

// A replicated head's o_proj share: the head's columns copied with the other replicas' channels zeroed.
TEST(ShardWeights, MaskedColumnSliceZeroesTheOtherReplicasChannels) {
  std::vector<float> w(3 * 8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i + 1);
  k3::WeightMatrix m;
  m.format = k3::WeightFormat::F32;
  m.data = w.data();
  m.rows = 3;
  m.cols = 8;
  k3::dist::ShardedWeights out;
  const k3::WeightMatrix s = k3::dist::masked_column_slice(m, {4, 4}, {2, 2}, out, "KDA o_proj", 4);
  ASSERT_EQ(s.cols, 4);
  const float* d = static_cast<const float*>(s.data);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(d[r * 4 + j], j < 2 ? 0.f : w[static_cast<size_t>(r * 8 + 4 + j)]);
  const k3::WeightMatrix all = k3::dist::masked_column_slice(m, {0, 8}, {0, 4}, out, "KDA o_proj", 2);
  EXPECT_NE(all.data, m.data);  // a copy even of all the columns: never zero the mapping
  EXPECT_EQ(static_cast<const float*>(all.data)[5], 0.f);
  EXPECT_EQ(w[5], 6.f);
}

TEST(ShardPlan, UnevenVocabularyLeavesTheLastRankFewerRows) {
  k3::ModelConfig c = tiny_k3();
  c.vocab_size = 1001;
  const auto p = k3::dist::make_shard_plan(c, 1, 2, false);
  EXPECT_EQ(p.vocab_chunk, 501);
  EXPECT_EQ(p.vocab.first, 501);
  EXPECT_EQ(p.vocab.count, 500);
}

// An MXFP4 matrix [2][96] of known values: its columns [32, 64) as a copy dequantise to the same values,
// and a slice through a 32-value block is refused (naming the way out for experts).
TEST(ShardWeights, ColumnSliceCopiesWholeBlocks) {
  const int64_t rows = 2, cols = 96, nb = cols / 32;
  std::vector<uint8_t> data(static_cast<size_t>(rows * nb * 16)), scales(static_cast<size_t>(rows * nb));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(120 + i);
  k3::WeightMatrix m;
  m.format = k3::WeightFormat::MXFP4;
  m.data = data.data();
  m.scales = scales.data();
  m.rows = rows;
  m.cols = cols;
  k3::dist::ShardedWeights out;
  const k3::WeightMatrix s = k3::dist::column_slice(m, {32, 32}, out, "dense MLP down_proj", 3);
  ASSERT_EQ(s.cols, 32);
  std::vector<float> whole(static_cast<size_t>(cols)), part(32);
  for (int64_t r = 0; r < rows; ++r) {
    k3::cpu::dequant_row(m, r, whole.data());
    k3::cpu::dequant_row(s, r, part.data());
    for (int64_t j = 0; j < 32; ++j) EXPECT_EQ(part[static_cast<size_t>(j)], whole[static_cast<size_t>(32 + j)]) << r << " " << j;
  }
  EXPECT_EQ(out.copied_bytes, rows * 16 + rows * 1);
  const std::string e = error_of([&] { k3::dist::column_slice(m, {48, 48}, out, "routed expert down_proj", 2); });
  EXPECT_NE(e.find("split MXFP4 blocks of 32 values (use --enable-expert-parallel)"), std::string::npos) << e;
  EXPECT_THROW(k3::dist::column_slice(m, {64, 64}, out, "x", 2), k3::Error);  // past the end
}

TEST(StepWire, RoundTripsAndRejectsTruncation) {
  k3::dist::StepMessage m;
  m.ops = {{k3::dist::MemOp::Alloc, 3, 0, 0, 0, 4096}, {k3::dist::MemOp::Copy, 3, 256, 2, 0, 128}};
  m.kda_chunk = 16;
  m.tokens = {5, 6, 7};
  m.logit_rows = {2};
  k3::dist::WireSeq s;
  s.n = 3;
  s.past = 9;
  s.prefill_form = 1;
  s.kda = {{3, 0}, {3, 64}};
  s.pages = {{4, 0}};
  s.page_tokens = 256;
  s.layer_stride = 1024;
  s.row_bytes = 4;
  m.seqs = {s};
  const std::vector<uint8_t> bytes = k3::dist::encode(m);
  const k3::dist::StepMessage d = k3::dist::decode(bytes);
  EXPECT_EQ(d.tokens, m.tokens);
  EXPECT_EQ(d.logit_rows, m.logit_rows);
  EXPECT_EQ(d.kda_chunk, 16);
  ASSERT_EQ(d.ops.size(), 2u);
  EXPECT_EQ(d.ops[1].src_region, 2u);
  ASSERT_EQ(d.seqs.size(), 1u);
  EXPECT_EQ(d.seqs[0].past, 9);
  EXPECT_EQ(d.seqs[0].kda[1].offset, 64u);
  EXPECT_EQ(d.seqs[0].pages[0].region, 4u);
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_THROW(k3::dist::decode(std::span(bytes.data(), cut)), k3::Error) << cut;
  std::vector<uint8_t> huge = bytes;
  huge[4] = 0xff;  // the op count's low byte: far more ops than bytes
  huge[11] = 0x7f;
  EXPECT_THROW(k3::dist::decode(huge), k3::Error);
}

// What a worker checks of rank 0's plan before running it.
TEST(StepWire, WorkerRefusesPlansThatDoNotAddUp) {
  k3::graph::StepPlan p;
  p.tokens = {1, 2, 3};
  p.seqs = {{0, 2, 0, nullptr, true}, {2, 1, 5, nullptr, false}};
  p.logit_rows = {1, 2};
  EXPECT_NO_THROW(k3::dist::check_step_plan(p, 1024));
  auto bad = [&](auto edit) {
    k3::graph::StepPlan q = p;
    edit(q);
    EXPECT_THROW(k3::dist::check_step_plan(q, 1024), k3::Error);
  };
  bad([](k3::graph::StepPlan& q) { q.tokens[1] = 1024; });
  bad([](k3::graph::StepPlan& q) { q.tokens[0] = -1; });
  bad([](k3::graph::StepPlan& q) { q.logit_rows = {3}; });
  bad([](k3::graph::StepPlan& q) { q.seqs[1].n = 2; });       // past the tokens
  bad([](k3::graph::StepPlan& q) { q.seqs[1].offset = 1; });  // overlapping
  bad([](k3::graph::StepPlan& q) { q.seqs.pop_back(); });     // a stray token
  bad([](k3::graph::StepPlan& q) { q.seqs[0].past = -1; });
  bad([](k3::graph::StepPlan& q) { q.seqs.clear(); });
}

// Everything rank 0's cache manager does through the journaled memory, replayed on a mirror, leaves the
// same bytes; a pointer from elsewhere is refused.
TEST(MirroredMemory, ReplayGivesTheSameBytes) {
  auto mem = std::make_shared<k3::dist::JournaledMemory>(k3::host_cache_memory());
  uint8_t* a = mem->allocate(512);
  uint8_t* b = mem->allocate(256);
  mem->zero(a, 512);
  mem->zero(b, 256);
  for (int i = 0; i < 64; ++i) b[i] = static_cast<uint8_t>(i + 1);  // rank 0's own writes: the forward's, mirrored by
  k3::dist::MemoryMirror mirror(k3::host_cache_memory());           // running it; here written on both sides
  mirror.apply(mem->take_journal());
  uint8_t* mb = mirror.resolve(mem->locate(b, 64), 64);
  for (int i = 0; i < 64; ++i) mb[i] = static_cast<uint8_t>(i + 1);
  mem->copy(a + 100, b, 64);
  mem->release(b);
  uint8_t* c = mem->allocate(128);
  mem->copy(c, a + 100, 32);
  mirror.apply(mem->take_journal());
  EXPECT_EQ(mirror.regions(), 2u);
  const uint8_t* ma = mirror.resolve(mem->locate(a, 512), 512);
  const uint8_t* mc = mirror.resolve(mem->locate(c, 32), 32);
  EXPECT_EQ(std::memcmp(ma, a, 512), 0);
  EXPECT_EQ(std::memcmp(mc, c, 32), 0);
  int outside = 0;
  EXPECT_THROW(mem->locate(&outside, 4), k3::Error);
  EXPECT_THROW(mem->locate(a + 500, 64), k3::Error);  // runs past the region
  EXPECT_THROW(mirror.resolve({999, 0}), k3::Error);
  EXPECT_THROW(mirror.apply({{k3::dist::MemOp::Release, 999, 0, 0, 0, 0}}), k3::Error);
  mem->release(a);
  mem->release(c);
}

TEST(CpuBackendDist, KeepExpertsMapsOwnedAndDropsTheRest) {
  k3::cpu::CpuBackend b;
  const auto p = k3::dist::make_shard_plan(tiny_k3(), 1, 4, /*expert_parallel=*/true);  // 16 experts: 4 each
  ASSERT_EQ(p.experts.first, 4);
  ASSERT_EQ(p.experts.count, 4);
  std::vector<int32_t> idx{0, 4, 7, 15, 6, 8};
  b.moe_keep_experts(k3::graph::Tensor::i32(idx.data(), 2, 3), p);  // owns experts 4..7
  EXPECT_EQ(idx, (std::vector<int32_t>{-1, 0, 3, -1, 2, -1}));
}

// The placement hook: a permutation moves experts between ranks; every lookup follows it, and what is
// not a permutation is refused.
TEST(ShardPlan, ExpertPlacementPermutes) {
  k3::dist::ExpertPlacement pl;
  for (int32_t e = 15; e >= 0; --e) pl.expert_order.push_back(e);  // reversed: rank 0 holds 15..8
  const auto r0 = k3::dist::make_shard_plan(tiny_k3(), 0, 2, true, pl);
  EXPECT_EQ(r0.local_expert(15), 0);
  EXPECT_EQ(r0.local_expert(8), 7);
  EXPECT_EQ(r0.local_expert(7), -1);
  EXPECT_EQ(r0.owner_of_expert(7), 1);
  EXPECT_EQ(r0.index_on_owner(7), 0);
  EXPECT_EQ(r0.owner_of_expert(15), 0);
  EXPECT_NE(k3::dist::describe(r0).find("routed experts {15 14 13 12 11 10 9 8} (EP)"), std::string::npos)
      << k3::dist::describe(r0);
  pl.expert_order[0] = 3;  // 3 twice, 15 missing
  EXPECT_NE(error_of([&] { k3::dist::make_shard_plan(tiny_k3(), 0, 2, true, pl); }).find("not a permutation"),
            std::string::npos);
  pl.expert_order.pop_back();
  EXPECT_NE(error_of([&] { k3::dist::make_shard_plan(tiny_k3(), 0, 2, true, pl); }).find("15 entries for 16 experts"),
            std::string::npos);
}

// Vocab-parallel embedding: a rank holding rows [4, 8) of an 8 x 3 table embeds tokens 4..7 and writes
// zeros for the others (the all-reduce adds the owning rank's row to those zeros).
TEST(CpuBackendDist, EmbedRowsTakesOwnedTokensAndZeroesTheRest) {
  std::vector<float> table(8 * 3);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) + 0.5f;
  k3::WeightMatrix full;
  full.format = k3::WeightFormat::F32;
  full.data = table.data();
  full.rows = 8;
  full.cols = 3;
  const k3::WeightMatrix mine = k3::dist::row_slice(full, {4, 4});
  k3::graph::StepPlan plan;
  plan.tokens = {5, 1, 7, 4};
  k3::cpu::CpuBackend b;
  b.begin_step(plan);
  std::vector<float> out(4 * 3, -1.f);
  b.embed_rows(mine, 4, k3::graph::Tensor::f32(out.data(), 4, 3));
  const std::vector<float> want{15.5f, 16.5f, 17.5f, 0, 0, 0, 21.5f, 22.5f, 23.5f, 12.5f, 13.5f, 14.5f};
  EXPECT_EQ(out, want);
}

// Two ranks as two threads: TP2 and TP2+EP2 logits of tiny-k3 against the one-process model, through
// prefill, decode, a batched step and a cloned cache.
void run_two_ranks(bool expert_parallel, k3::MoeActivationDType act = k3::MoeActivationDType::F32) {
  const std::string dir = k3test::source_path("tests/data/tiny-k3");
  auto group = std::make_shared<k3test::ThreadGroup>(2);
  k3::dist::TpLoadOptions opt;
  opt.expert_parallel = expert_parallel;
  opt.moe_activation = act;
  opt.print_plan = false;
  std::thread worker([&] {
    auto m = k3::dist::TpModel::load(dir, std::make_unique<k3test::ThreadComm>(group, 1), opt);
    m->run_worker();
  });
  double max_rel = 0;
  {
    auto tp = k3::dist::TpModel::load(dir, std::make_unique<k3test::ThreadComm>(group, 0), opt);
    EXPECT_EQ(tp->cache_spec().kda_heads, 1);  // each rank keeps its heads' state
    auto ref = k3::Model::load(dir);
    ref->set_moe_activation_dtype(act);
    const int64_t V = ref->config().vocab_size;
    auto a = tp->new_cache(), r = ref->new_cache();
    std::vector<int32_t> toks{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
    std::vector<float> la, lr;
    for (int step = 0; step < 4; ++step) {
      tp->forward(toks, *a, la);
      ref->forward(toks, *r, lr);
      ASSERT_EQ(la.size(), lr.size());
      double d = 0, mx = 0;
      for (size_t i = 0; i < lr.size(); ++i) {
        d = std::max(d, static_cast<double>(std::fabs(la[i] - lr[i])));
        mx = std::max(mx, static_cast<double>(std::fabs(lr[i])));
      }
      max_rel = std::max(max_rel, d / mx);
      const int32_t next = static_cast<int32_t>(std::max_element(lr.begin(), lr.end()) - lr.begin());
      EXPECT_EQ(std::max_element(la.begin(), la.end()) - la.begin(), next) << "step " << step;
      toks = {next % static_cast<int32_t>(V)};
    }
  }  // rank 0's model stops the worker
  worker.join();
  EXPECT_LT(max_rel, 1e-4);  // the bound derived in tests/mpi/tp_logits_check.cpp
  EXPECT_GT(max_rel, 0.0);   // the partial sums really were split (a silent one-rank run would be exact)
}

TEST(TensorParallel, TwoThreadRanksMatchOneProcessTinyK3) { run_two_ranks(false); }
TEST(TensorParallel, TwoThreadRanksExpertParallelMatchOneProcessTinyK3) { run_two_ranks(true); }
// --moe-activation-dtype mxfp8 on CPU ranks: each rank rounds whole MXFP8 blocks of its expert columns (tiny-k3's 64
// split 32 + 32), so TP2 and EP2 match the one-process mxfp8 model as float32 activations do.
TEST(TensorParallel, TwoThreadRanksMxfp8MatchOneProcessTinyK3) {
  run_two_ranks(false, k3::MoeActivationDType::MXFP8);
  run_two_ranks(true, k3::MoeActivationDType::MXFP8);
}

// A rank whose expert columns do not start on a block of 32 would round other blocks than the whole model does:
// tiny-kimi-linear's 48 columns over 3 ranks are 16 + 16 + 16, refused by ranks 0 and 1 (rank 2's end the row), so
// every rank fails the load.
TEST(TensorParallel, Mxfp8RefusesExpertColumnsOffTheBlocks) {
  const std::string dir = k3test::source_path("tests/data/tiny-kimi-linear");
  auto group = std::make_shared<k3test::ThreadGroup>(3);
  k3::dist::TpLoadOptions opt;
  opt.moe_activation = k3::MoeActivationDType::MXFP8;
  opt.print_plan = false;
  std::string errors[3];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      try {
        k3::dist::TpModel::load(dir, std::make_unique<k3test::ThreadComm>(group, r), opt);
      } catch (const k3::Error& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  EXPECT_NE(errors[0].find("columns 0..16 do not fall on the blocks of 32"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("columns 16..32 do not fall on the blocks of 32"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("another rank failed"), std::string::npos) << errors[2];
  opt.expert_parallel = true;  // whole experts per rank: fine (one rank through the collective path here)
  opt.collectives_at_one_rank = true;
  EXPECT_NO_THROW(k3::dist::TpModel::load(dir, k3::dist::make_local_comm(), opt));
}

}  // namespace

// One rank through the communicator's path (vocab-parallel embedding, all-reduces, the logits gather,
// EP's expert mapping; every collective an identity over LocalComm): bit-identical to the one-process
// model. The CPU half of the check tests/cuda/test_tp_nccl.cpp makes over NCCL on a GPU. Fails if a
// collective op at one rank changes a value (e.g. a gather that drops or pads columns).
TEST(TensorParallel, OneRankThroughTheCollectivePathIsBitIdentical) {
  const std::string dir = k3test::source_path("tests/data/tiny-k3");
  auto ref = k3::Model::load(dir);
  for (int run = 0; run < 4; ++run) {  // TP / EP, float32 / mxfp8 expert activations
    const bool ep = run % 2 == 1;
    const auto act = run < 2 ? k3::MoeActivationDType::F32 : k3::MoeActivationDType::MXFP8;
    ref->set_moe_activation_dtype(act);
    k3::dist::TpLoadOptions opt;
    opt.print_plan = false;
    opt.expert_parallel = ep;
    opt.moe_activation = act;
    opt.collectives_at_one_rank = true;
    auto tp = k3::dist::TpModel::load(dir, k3::dist::make_local_comm(), opt);
    ASSERT_TRUE(tp->shard_plan().runs_collectives());
    auto a = tp->new_cache(), r = ref->new_cache();
    std::vector<int32_t> toks{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
    std::vector<float> la, lr;
    k3::ForwardOptions all;
    all.all_logits = true;
    tp->forward(toks, *a, la, all);
    ref->forward(toks, *r, lr, all);
    EXPECT_EQ(la, lr) << "ep " << ep << " " << k3::moe_activation_dtype_name(act);
    for (int step = 0; step < 3; ++step) {
      const auto last = lr.end() - ref->config().vocab_size;  // the last row's greedy token
      const std::vector<int32_t> t{static_cast<int32_t>(std::max_element(last, lr.end()) - last)};
      tp->forward(t, *a, la);
      ref->forward(t, *r, lr);
      EXPECT_EQ(la, lr) << "ep " << ep << " " << k3::moe_activation_dtype_name(act) << " step " << step;
    }
  }
}

// GPU ranks take their host's GPUs round-robin; the group uses NCCL only if no GPU of any host holds two ranks,
// and every rank must reach the same answer: 3 ranks on a 2-GPU host put the one on cuda:1 on NCCL and the two on
// cuda:0 on host staging, and the first collective hung (call s28-7). Here the lone rank sees the group's answer.
TEST(GpuPlacement, RoundRobinAndOneAnswerForTheWholeGroup) {
  const k3::dist::GpuPlace p0 = k3::dist::place_on_gpus(0, 0, 3, 2), p1 = k3::dist::place_on_gpus(0, 1, 3, 2),
                           p2 = k3::dist::place_on_gpus(0, 2, 3, 2);
  EXPECT_EQ(p0.gpu, 0);
  EXPECT_EQ(p0.ranks_on_gpu, 2);
  EXPECT_EQ(p1.gpu, 1);
  EXPECT_EQ(p1.ranks_on_gpu, 1);  // alone on its GPU, yet its group shares one
  EXPECT_EQ(p2.gpu, 0);
  EXPECT_EQ(p2.ranks_on_gpu, 2);
  const k3::dist::GpuPlace q = k3::dist::place_on_gpus(1, 1, 2, 2);  // --device cuda:1: the second rank wraps to 0
  EXPECT_EQ(q.gpu, 0);
  EXPECT_EQ(q.ranks_on_gpu, 1);
  EXPECT_TRUE(k3::dist::host_shares_a_gpu(3, 2));
  EXPECT_FALSE(k3::dist::host_shares_a_gpu(2, 2));
  EXPECT_FALSE(k3::dist::host_shares_a_gpu(1, 0));  // no GPU visible counts as one
  for (int sharing_rank : {-1, 2}) {  // none shares; only rank 2's "host" shares
    auto group = std::make_shared<k3test::ThreadGroup>(3);
    std::vector<int> got(3, -1);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
      ts.emplace_back([&, r] {
        k3test::ThreadComm c(group, r);
        got[static_cast<size_t>(r)] = k3::dist::group_shares_a_gpu(c, r == sharing_rank) ? 1 : 0;
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < 3; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], sharing_rank >= 0 ? 1 : 0) << "rank " << r;
  }
}
