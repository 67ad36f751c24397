// TP1 through NCCL on one GPU: the CUDA model with a one-rank NcclComm on its stream runs the graph's
// sharded path (vocab-parallel embedding, an all-reduce after every row-parallel linear, the head's
// logits gathered) and must give bit-identical logits to the model without a communicator: at one rank
// every collective is an identity, so any difference is a bug in the collective path (a wrong offset, a
// stride lost in packing, a collective on another stream racing the kernels). Prefill (all positions),
// decode steps eagerly and through the captured CUDA graphs (the NCCL calls captured with the kernels).
// The CPU half of the check: TensorParallel.OneRankThroughTheCollectivePathIsBitIdentical (k3_tests).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "k3/backend/cuda/cuda_model.h"
#include "k3/core/error.h"
#include "k3/dist/communicator.h"
#include "k3/dist/nccl_comm.h"
#include "test_util.h"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int32_t argmax_last(const std::vector<float>& l, int64_t V) {
  const auto last = l.end() - V;
  return static_cast<int32_t>(std::max_element(last, l.end()) - last);
}

void run(const std::string& model, bool eager) {
  const std::string dir = k3test::source_path(model);
  k3::cuda::CudaLoadOptions plain;
  plain.enforce_eager = eager;
  k3::cuda::CudaLoadOptions via = plain;
  // The bootstrap carries NCCL's unique id: one rank, so a LocalComm.
  auto boot = std::shared_ptr<k3::dist::Communicator>(k3::dist::make_local_comm());
  via.communicator = [boot](void* stream) { return k3::dist::make_nccl_comm(*boot, 0, stream); };
  auto a = k3::cuda::CudaModel::load(dir, plain);
  auto b = k3::cuda::CudaModel::load(dir, via);
  const int64_t V = a->config().vocab_size;
  auto ca = a->new_cache(), cb = b->new_cache();
  std::vector<int32_t> prompt(29);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(V));
  std::vector<float> la, lb;
  k3::ForwardOptions all;
  all.all_logits = true;
  a->forward(prompt, *ca, la, all);
  b->forward(prompt, *cb, lb, all);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_TRUE(la == lb) << model << ": prefill logits differ through NCCL";
  for (int step = 0; step < 6; ++step) {
    const std::vector<int32_t> tok{argmax_last(la, V)};
    a->forward(tok, *ca, la);
    b->forward(tok, *cb, lb);
    EXPECT_TRUE(la == lb) << model << ": decode step " << step << (eager ? " (eager)" : " (CUDA graphs)");
  }
  if (!eager) {
    EXPECT_GT(b->graph_replays(), 0) << "the decode steps did not run as CUDA graphs";
  }
  std::printf("%s, %s: TP1 through NCCL bit-identical over a %zu-token prefill and 6 decode steps\n", model.c_str(),
              eager ? "eager" : "CUDA graphs", prompt.size());
}

TEST(TpNccl, OneRankThroughNcclGivesIdenticalLogitsTinyK3) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run("tests/data/tiny-k3", true);
  run("tests/data/tiny-k3", false);
}

TEST(TpNccl, OneRankThroughNcclGivesIdenticalLogitsK3Tiny) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run("models/k3-tiny", false);
}

TEST(TpNccl, AWholeModelOnATwoRankCommunicatorIsRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // A communicator that says 2 ranks (its collectives are never reached) for a whole model (a shard is
  // CudaModel::load_shard's job): refused at load, clearly.
  struct TwoRanks final : k3::dist::Communicator {
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::string name() const override { return "fake"; }
    void all_reduce_sum(float*, size_t) override {}
    void all_gather(const void*, size_t, void*) override {}
    void gather(const void*, size_t, void*, int) override {}
    void broadcast(void*, size_t, int) override {}
    void all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>) override {}
    void barrier() override {}
    [[noreturn]] void abort(int code) override { std::_Exit(code); }
  };
  k3::cuda::CudaLoadOptions opt;
  opt.communicator = [](void*) { return std::make_unique<TwoRanks>(); };
  try {
    k3::cuda::CudaModel::load(k3test::source_path("tests/data/tiny-k3"), opt);
    ADD_FAILURE() << "a 2-rank communicator was accepted";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a communicator of 2 ranks for a whole model"), std::string::npos) << e.what();
  }
}

}  // namespace
