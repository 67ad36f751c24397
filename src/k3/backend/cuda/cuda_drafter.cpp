#include "k3/backend/cuda/cuda_drafter.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/device_weights.h"
#include "k3/backend/cuda/drafter_kernels.h"
#include "k3/backend/cuda/host_staging.h"
#include "k3/backend/cuda/step_graphs.h"
#include "k3/core/error.h"
#include "k3/model/drafter/drafter_forward.h"

namespace k3::cuda {

namespace {

class CudaDrafterRunner final : public drafter::DrafterRunner {
 public:
  CudaDrafterRunner(const drafter::DrafterConfig& c, const drafter::DrafterWeights& host, int device, const ModelWeights* target)
      : c_(c), device_(device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n)
      throw Error("block drafter: CUDA device " + std::to_string(device) + " is not visible");
    if (2 * c.block_size * c.head_dim + c.block_size * c.block_size > 12 * 1024)
      throw Error("block drafter: block_size " + std::to_string(c.block_size) + " x head_dim " + std::to_string(c.head_dim) +
                  " is too large for the CUDA block attention (a block's keys and values must fit in 48 KiB)");
    K3_CUDA_CHECK(cudaSetDevice(device));
    K3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The backend sizes its buffers from a model config: the drafter's width and the target's vocabulary;
    // no KDA, MLA or MoE layers, so none of their workspaces.
    mcfg_.hidden_size = c.hidden_size;
    mcfg_.vocab_size = c.target_vocab_size;
    mcfg_.rms_norm_eps = c.rms_norm_eps;
    backend_ = std::make_unique<CudaBackend>(mcfg_, spec_, stream_, /*gemm_bf16=*/false, prof_);
    upload(host, target);
  }
  ~CudaDrafterRunner() override {
    graphs_.clear();
    backend_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  void forward(const graph::StepPlan& plan, std::span<const float> ctx, int64_t n_out, std::vector<float>& logits) override {
    const size_t logit_bytes = enqueue(plan, ctx, n_out, false);
    K3_CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_d_.get(), logit_bytes, cudaMemcpyDeviceToHost, stream_));
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Greedy drafts: the argmax on the device, only the ids come back (k3-tiny at k = 4: 16 bytes instead of
  // 2.6 MB of logits and a host scan of 655k floats per step).
  bool draft_ids(const graph::StepPlan& plan, std::span<const float> ctx, int64_t n_out, std::vector<int32_t>& ids) override {
    const int64_t rows = plan.n_tokens() * n_out;
    const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    enqueue(plan, ctx, n_out, true);
    auto* h = static_cast<int32_t*>(ids_h_.ensure(id_bytes));
    K3_CUDA_CHECK(cudaMemcpyAsync(h, ids_d_.get(), id_bytes, cudaMemcpyDeviceToHost, stream_));
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ids.assign(h, h + rows);
    return true;
  }
  std::string device_name() const override {
    return "cuda:" + std::to_string(device_) + (shared_target_ ? " (the target's embedding and lm_head)" : "");
  }

 private:
  // The drafter's forward enqueued, its logits [R * n_out][V] in logits_d_ (and with `argmax` their
  // argmax per row in ids_d_); returns the logits' bytes. A step of a shape seen before replays a captured
  // CUDA graph (step_graphs.h: captured on the second sight; ~55 small kernels, whose launches were most of
  // the eager step on the H200); K3_DRAFTER_GRAPHS=0 runs every step eagerly.
  size_t enqueue(const graph::StepPlan& plan, std::span<const float> ctx, int64_t n_out, bool argmax) {
    K3_CUDA_CHECK(cudaSetDevice(device_));
    const int64_t R = plan.n_tokens(), V = c_.target_vocab_size;
    const size_t ctx_bytes = ctx.size() * 4, logit_bytes = static_cast<size_t>(R * n_out * V) * 4,
                 id_bytes = static_cast<size_t>(R * n_out) * sizeof(int32_t);
    // A captured graph holds these buffers' addresses: a reallocation drops the graphs.
    if (ctx_d_.bytes() < ctx_bytes || logits_d_.bytes() < logit_bytes || ids_d_.bytes() < id_bytes) graphs_.clear();
    if (ctx_d_.bytes() < ctx_bytes) ctx_d_ = DeviceBuffer(2 * ctx_bytes);
    if (logits_d_.bytes() < logit_bytes) logits_d_ = DeviceBuffer(2 * logit_bytes);
    if (ids_d_.bytes() < id_bytes) ids_d_ = DeviceBuffer(2 * id_bytes);
    backend_->prepare(plan);  // the tokens the embedding reads; scratch for the step
    K3_CUDA_CHECK(cudaMemcpyAsync(ctx_d_.get(), ctx.data(), ctx_bytes, cudaMemcpyHostToDevice, stream_));
    auto body = [&] {
      drafter::drafter_forward(c_, w_, *backend_, plan, graph::Tensor::f32(ctx_d_.get<float>(), R, c_.ctx_dim()), n_out,
                               graph::Tensor::f32(logits_d_.get<float>(), R * n_out, V));
      if (argmax) K3_CUDA_CHECK(argmax_rows(logits_d_.get<float>(), R * n_out, V, ids_d_.get<int32_t>(), stream_));
    };
    if (!use_graphs_) {
      body();
    } else {
      key_ = backend_->graph_key();
      key_.insert(key_.end(), {-2, R, n_out, argmax ? 1 : 0});
      graphs_.run(key_, *backend_, stream_, false, body);
    }
    return logit_bytes;
  }

  void upload(const drafter::DrafterWeights& h, const ModelWeights* target) {
    auto lin = [&](const WeightMatrix& m) { return upload_linear(arena_, device_, m); };
    auto vec = [&](const WeightVector& v) { return upload_vector(arena_, device_, v); };
    w_.context_proj = lin(h.context_proj);
    w_.input_proj = lin(h.input_proj);
    w_.context_norm = vec(h.context_norm);
    w_.embed_norm = vec(h.embed_norm);
    w_.final_norm = vec(h.final_norm);
    w_.mask_embedding = vec(h.mask_embedding);
    w_.position_embedding = vec(h.position_embedding);
    for (const drafter::DrafterLayerWeights& L : h.layers)
      w_.layers.push_back({vec(L.attn_norm), vec(L.mlp_norm), lin(L.q), lin(L.k), lin(L.v), lin(L.o), lin(L.gate), lin(L.up),
                           lin(L.down)});
    // The target's copies where they are on this GPU (shapes checked: the drafter was made for this target).
    auto here = [&](const WeightMatrix& m, const WeightMatrix& want) {
      return target && m.device == device_ && m.rows == want.rows && m.cols == want.cols;
    };
    w_.target_embed = here(target ? target->embed : h.target_embed, h.target_embed)
                          ? target->embed
                          : upload_embedding_table(arena_, device_, h.target_embed);
    w_.target_lm_head = here(target ? target->lm_head : h.target_lm_head, h.target_lm_head) ? target->lm_head
                                                                                              : lin(h.target_lm_head);
    shared_target_ = target && w_.target_embed.data == target->embed.data;
  }

  const drafter::DrafterConfig& c_;
  int device_;
  cudaStream_t stream_ = nullptr;
  ModelConfig mcfg_;
  CacheSpec spec_;
  Profiler prof_{false};
  std::unique_ptr<CudaBackend> backend_;
  DeviceArena arena_;
  drafter::DrafterWeights w_;  // views into arena_
  DeviceBuffer ctx_d_, logits_d_, ids_d_;
  bool shared_target_ = false;
  PinnedBuffer ids_h_;
  bool use_graphs_ = [] {
    const char* e = std::getenv("K3_DRAFTER_GRAPHS");
    return !(e && std::string(e) == "0");
  }();
  StepGraphs graphs_;  // declared after the buffers and the backend it captured: destroyed first
  StepGraphs::Key key_;
};

}  // namespace

std::unique_ptr<drafter::DrafterRunner> make_cuda_drafter_runner(const drafter::DrafterConfig& c,
                                                                const drafter::DrafterWeights& host, int device,
                                                                const ModelWeights* target) {
  return std::make_unique<CudaDrafterRunner>(c, host, device, target);
}

}  // namespace k3::cuda
