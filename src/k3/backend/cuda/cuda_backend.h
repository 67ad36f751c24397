// The CUDA backend: the graph's ops (model/graph/backend.h) on one GPU, every kernel enqueued on one
// stream. Per step, prepare() builds on the host the one staging block the kernels read (token maps,
// the MLA page tables and KDA state descriptors of every layer, the logits rows) and sizes scratch and
// workspaces; begin_step() (run by the graph, so inside a captured CUDA graph too) enqueues its upload.
// Nothing in a step allocates or synchronises once the backend is warm for that step's shape, so a
// decode step can be captured and replayed (cuda_model.cpp); generation() changes whenever a buffer the
// ops refer to moves, which invalidates captured graphs.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "k3/backend/cuda/cuda_profiler.h"
#include "k3/backend/cuda/device_scratch.h"
#include "k3/backend/cuda/expert_streamer.h"
#include "k3/backend/cuda/host_staging.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/mla_kernels.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/core/moe_activation.h"
#include "k3/model/config.h"
#include "k3/model/graph/backend.h"
#include "k3/runtime/cache_spec.h"

namespace k3 {
class ExpertResidency;
}

namespace k3::cuda {

class CudaBackend final : public graph::Backend {
 public:
  // KDA chunk of the prefill form when the step does not set one (fastest on an H200 at 1 x 4096
  // tokens: docs/perf/cuda.md); other sizes than 16/32/64 run the recurrence.
  static constexpr int kDefaultKdaChunk = 32;
  static constexpr int kDefaultKdaTcChunk = 32;  // kda_chunked_tc's: 32 beat 64 at every measured shape (docs/perf/cuda.md)

  CudaBackend(const ModelConfig& c, const CacheSpec& spec, cudaStream_t stream, bool gemm_bf16, Profiler& prof);
  // The batch size (tokens) from which a layer's host-placed experts are streamed to the GPU (--cpu-moe
  // prefill): 6 (token, expert) pairs per expert for MXFP4 experts, scaled by bytes per parameter.
  static int64_t default_moe_stream_min_tokens(const ModelConfig& c);
  ~CudaBackend() override;

  // Host side of a step (before the graph runs or a captured graph is replayed).
  void prepare(const graph::StepPlan& plan);
  // The routed-expert bank's shape when it is not the config's: a tensor / expert parallel shard's (EP: its
  // expert slots; TP: its columns of each expert). Before the first step.
  void set_expert_shape(int E, int I) {
    moe_E_ = E;
    moe_I_ = I;
  }
  // The residency manager of the host-placed routed experts (model/expert_residency_setup.h; null: none): the
  // host expert jobs report their routing to it, as the CPU model's MoE op does. Outlives the backend.
  void set_host_expert_residency(ExpertResidency* r) { host_residency_ = r; }
  // --moe-activation-dtype: the routed experts' activations (moe_kernels.h MoePrecision::Mxfp8 for MXFP8, on the device
  // and on the host CPU backend of --cpu-moe experts alike). Before the first step. Q8 has no device kernels yet:
  // k3::Error.
  void set_moe_activation_dtype(MoeActivationDType t);
  // The routed experts' kernels' precision: Mxfp8 under --moe-activation-dtype mxfp8, else the GEMMs' (bf16 / bf16x2).
  cuda::MoePrecision moe_precision() const {
    if (moe_act_ == MoeActivationDType::MXFP8) return MoePrecision::Mxfp8;
    return gemm_bf16_ ? MoePrecision::Bf16 : MoePrecision::Bf16x2;
  }
  // What a captured decode graph is valid for: (sequences, page-table stride) at this generation.
  // What a captured decode graph depends on beyond the staged tables: the batch, the page stride, and the
  // step's shape when sequences have several rows (speculative verification: rows and snapshots per sequence).
  const std::vector<int64_t>& graph_key() const { return graph_key_; }
  uint64_t generation() const {
    return generation_ + scratch_.generation() + lin_->generation() + moe_in_.generation() + moe_out_.generation();
  }
  // Piecewise capture of a decode step whose routed experts run on the host (--cpu-moe): between
  // begin_host_cuts and end_host_cuts, each host expert job ends the stream's capture there (a piece),
  // stores the job to run on the host after that piece's launch, and begins capturing the next piece,
  // whose first node uploads the job's result. CudaModel replays piece, job, piece, job, ..., piece. The
  // host dense ops (host_linear / host_embed) synchronise the stream and cannot be cut: they throw here.
  struct HostCut {
    cudaGraph_t piece = nullptr;         // the stream's work up to (and including) the job's inputs' download
    std::function<void()> host_job;      // waits for those inputs, runs the CPU kernels
  };
  void begin_host_cuts(std::vector<HostCut>* cuts) { cuts_ = cuts; }
  void end_host_cuts() { cuts_ = nullptr; }
  int64_t moe_stream_min_tokens() const { return moe_stream_min_tokens_; }
  // [n_logits][V] on the device, filled by the step's head.
  graph::Tensor logits() const;
  // [T * n_logits][H] on the device: the step's taps (plan.tap_layers, T of them; graph/forward.h).
  graph::Tensor taps() const;
  LinearRunner& linear_runner() { return *lin_; }

  void begin_step(const graph::StepPlan& plan) override;
  graph::Tensor scratch(int64_t rows, int64_t cols, graph::ElemType type) override;
  size_t scratch_mark() const override { return scratch_.mark(); }
  void scratch_release(size_t mark) override { scratch_.release(mark); }

  void embed(const WeightMatrix& table, graph::Tensor out) override;
  void linear(const WeightMatrix& W, graph::Tensor x, graph::Tensor y) override;
  void linear_group(graph::Tensor x, std::span<const graph::Projection> ps) override;
  void rmsnorm(graph::Tensor x, const float* w, int64_t dim, float eps, graph::Tensor y) override;
  void add_rmsnorm(graph::Tensor y, graph::Tensor x, const float* w, float eps, graph::Tensor out) override;
  void glu(graph::Tensor gate, graph::Tensor up, const graph::GluParams& p) override;
  void add(graph::Tensor y, graph::Tensor x) override;
  void copy(graph::Tensor dst, graph::Tensor src) override;
  void sigmoid_mul(graph::Tensor y, graph::Tensor g) override;
  void gather_logit_rows(graph::Tensor h, graph::Tensor out) override;
  void block_attention(graph::Tensor q, graph::Tensor k, graph::Tensor v, int64_t block, int64_t heads,
                       int64_t head_dim, float scale, graph::Tensor o) override;
  void attn_res_mix(graph::Tensor blocks, int64_t nb, graph::Tensor partial, const float* w, float eps,
                    graph::Tensor out) override;
  void attn_res_mix_rmsnorm(graph::Tensor blocks, int64_t nb, graph::Tensor partial, const float* w, float eps,
                            const float* norm_w, graph::Tensor out) override;

  void kda_conv_l2norm(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, graph::Tensor pq, graph::Tensor pk,
                       graph::Tensor pv, graph::Tensor q, graph::Tensor k, graph::Tensor v) override;
  void kda_gates(const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate, graph::Tensor g,
                 graph::Tensor beta) override;
  void kda_recurrence(int64_t layer, const graph::KdaDims& d, graph::Tensor q, graph::Tensor k, graph::Tensor v,
                      graph::Tensor g, graph::Tensor beta, graph::Tensor o) override;
  void kda_output_gate(const KdaWeights& w, const graph::KdaDims& d, float eps, graph::Tensor o,
                       graph::Tensor gate) override;
  void kda_mix(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate, float eps,
               graph::Tensor pq, graph::Tensor pk, graph::Tensor pv, graph::Tensor graw, graph::Tensor braw,
               graph::Tensor gate_proj, graph::Tensor o) override;

  // kda_mix's prefill under --gemm-precision bf16 (cuda_backend_kda.cpp): q / k / v / g handed to the tensor-core
  // chunk kernels as bf16 planes.
  bool kda_bf16_prefill_ok() const;
  void kda_prefill_bf16(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate,
                        float eps, graph::Tensor pq, graph::Tensor pk, graph::Tensor pv, graph::Tensor graw,
                        graph::Tensor braw, graph::Tensor gate_proj, graph::Tensor o);

  void mla_write_latents(int64_t layer, const graph::MlaDims& d, graph::Tensor lat) override;
  void mla_absorb_q(const MlaWeights& w, const graph::MlaDims& d, graph::Tensor q, graph::Tensor ql) override;
  void mla_attend_latent(int64_t layer, const graph::MlaDims& d, graph::Tensor ql, float scale,
                         graph::Tensor ol) override;
  void mla_up_v(const MlaWeights& w, const graph::MlaDims& d, graph::Tensor ol, graph::Tensor o) override;
  void mla_attend_mha(int64_t layer, const MlaWeights& w, const graph::MlaDims& d, graph::Tensor q, float scale,
                      graph::Tensor o) override;

  void moe_route(graph::Tensor logits, const float* bias, const graph::RouteParams& p, graph::Tensor idx,
                 graph::Tensor wts) override;
  void moe_experts(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                   const graph::GluParams& p, graph::Tensor out) override;
  void moe_experts_start(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                         const graph::GluParams& p, graph::Tensor out) override;
  void moe_experts_wait() override;
  bool moe_experts_overlap() const override { return true; }
  bool moe_fuses_shared(const MoeWeights& w, int64_t n) const override;
  void moe_experts_with_shared(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                               const graph::GluParams& p, graph::Tensor out) override;
  // Tensor / expert parallel over the communicator (NcclComm: device buffers, this backend's stream;
  // cuda_backend_dist.cpp).
  void embed_rows(const WeightMatrix& table, int64_t first, graph::Tensor out) override;
  void all_reduce_sum(graph::Tensor x) override;
  void gather_cols(graph::Tensor local, int64_t chunk, graph::Tensor out) override;
  void moe_keep_experts(graph::Tensor idx, const dist::ShardPlan& shard) override;

 private:
  // Offsets in the staging block of the step data the kernels read.
  // One round of a step with KDA state snapshots: piece r of every sequence (sequences without snapshots
  // whole in round 0; one with snapshots after rows a .. a+m-1 cut there), then the states after the round
  // copied into the snapshot slots.
  struct KdaRound {
    size_t conv = 0, rec = 0;  // staged KdaSeq arrays: every sequence's piece / the decode-form ones'
    int n_conv = 0, n_rec = 0;
    size_t conv_copies = 0, state_copies = 0;  // staged CopySeg arrays: conv tails / states after the round
    int n_conv_copies = 0, n_state_copies = 0;
  };
  struct StepData {
    size_t tokens = 0, tok_seq = 0, tok_pos = 0, logit_rows = 0, page_start = 0, page_tokens = 0, dec_tokens = 0,
           layer_stride = 0, pages = 0;  // pages: one pointer per page, every layer
    std::vector<size_t> kda_all, kda_rec, kda_chk;  // per KDA layer: KdaSeq arrays
    int n_rec = 0, n_chk = 0, n_dec_tokens = 0, kda_chunk = 0;
    bool kda_tc = false;  // the step's chunked sequences take kda_chunked_tc (kda_tc_ and a chunk it runs)
    // Speculative verification (StepSeq::n_snapshots): per KDA layer, the rounds the conv and the
    // recurrence run in (cuda_backend_kda.cpp); empty when no sequence of the step saves a state.
    std::vector<std::vector<KdaRound>> kda_rounds;
    // The same step on the fused verification kernel instead (every sequence decode-form): per KDA layer
    // the staged KdaSnapSeq and snapshot-view arrays (kda_verify_fused); empty when not taken.
    std::vector<size_t> kda_verify, kda_snaps;
  };
  template <typename T>
  T* staged(size_t off) const { return reinterpret_cast<T*>(staging_d_.get<uint8_t>() + off); }
  MlaPaging paging(int64_t layer) const;
  void stage_mla(const graph::StepPlan& plan);
  void stage_kda(const graph::StepPlan& plan);
  // StepData::kda_rounds of a step whose plan has snapshots (cuda_backend_kda.cpp).
  void stage_kda_rounds(const graph::StepPlan& plan);
  // StepData::kda_verify of such a step when every sequence is decode-form (K3_KDA_FUSED_VERIFY=0: never).
  bool stage_kda_verify(const graph::StepPlan& plan);
  void run_copies(size_t staged_segs, int n);
  void size_workspaces(int64_t N, int64_t R, int64_t T);
  // Ops over weights whose home is the host (placement: -ot / --cpu-moe): the activations go to the host,
  // the CPU backend's kernels run, the results come back (cuda_backend_host.cpp). host_linear and
  // host_embed synchronise the stream (no CUDA graphs with them); the expert jobs are cut into pieces.
  void host_linear(const WeightMatrix& W, graph::Tensor x, graph::Tensor y);
  void host_embed(const WeightMatrix& table, graph::Tensor out);
  void host_moe_start(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                      const graph::GluParams& p, graph::Tensor out);
  void host_moe_finish();
  struct PendingHostMoe;
  // The CPU half of a host expert job: wait for its inputs' download, run the CPU backend's experts into `out`.
  void run_host_moe(const PendingHostMoe& m, graph::Tensor out);
  // A batch of at least moe_stream_min_tokens_ tokens: the layer's host experts go to the GPU and are
  // computed there (expert_streamer.h); false when not streamed.
  bool stream_host_experts(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                           const graph::GluParams& p, graph::Tensor out);
  // MHA form of one prefill-form sequence (cuda_backend_mla.cpp).
  void mla_prefill_mha(const MlaWeights& w, const graph::MlaDims& d, const MlaPaging& pg, int seq, int64_t offset,
                       int64_t n, int64_t past, const float* q, float scale, float* out);

  const ModelConfig& cfg_;
  const CacheSpec& spec_;
  cudaStream_t stream_;
  std::unique_ptr<LinearRunner> lin_;
  bool gemm_bf16_;
  MoeActivationDType moe_act_ = MoeActivationDType::F32;
  // KDA prefill on tensor cores (kda_chunked_tc): only when the model runs with plain bf16 GEMMs (the user
  // already accepted bf16 rounding; the default bf16x2 keeps the exact fp32 kda_chunked) and D = 128. A gate
  // bounded with lower_bound >= -5.5 (K3) takes the factored kernels at chunk 32 or 64; any other (Kimi-Linear's
  // unbounded gate) the exact-diagonal form (KdaDecays::Any), chunk 32 only -- other chunks take kda_chunked.
  bool kda_tc_;
  bool kda_tc_any_decay_;
  Profiler& prof_;
  const graph::StepPlan* plan_ = nullptr;

  DeviceScratch scratch_;
  int64_t token_cap_ = 0;       // tokens the scratch and workspaces are sized for
  int moe_E_ = -1, moe_I_ = -1;  // set_expert_shape (-1: the config's)
  size_t bytes_per_token_ = 0;  // scratch high-water per token of the largest step so far
  uint64_t generation_ = 1;     // bumped when a workspace or the staging moves
  std::unique_ptr<MoeWorkspace> moe_ws_;
  DeviceBuffer kda_ws_, mla_ws_, mha_ws_, logits_d_, taps_d_;
  int64_t n_taps_ = 0;  // plan.tap_layers.size() of the step

  PinnedBuffer host_in_, host_out_;  // the host ops' activations
  // Routed experts on the host between moe_experts_start and _wait (cuda_backend_host.cpp).
  struct PendingHostMoe {
    const MoeWeights* w;
    graph::Tensor x, idx, wts;  // in moe_in_
    graph::GluParams p;
    graph::Tensor out;          // on the device
  };
  std::optional<PendingHostMoe> pending_moe_;
  std::vector<HostCut>* cuts_ = nullptr;  // set while a decode step is captured in pieces
  PinnedBuffer moe_in_, moe_out_;
  CudaEvent moe_inputs_ready_;
  // K3_HYBRID_OVERLAP=0 runs the shared experts after the host experts (to measure the overlap's gain).
  bool overlap_host_moe_ = true;
  // Batches of >= this many tokens stream their host experts to the GPU: default_moe_stream_min_tokens,
  // or K3_MOE_STREAM_MIN_TOKENS=N (0: never).
  int64_t moe_stream_min_tokens_ = 0;
  ExpertStreamer streamer_;
  std::unique_ptr<graph::Backend> host_cpu_;  // the CPU backend the host ops run on
  ExpertResidency* host_residency_ = nullptr;

  Staging st_;
  StepData sd_;
  PinnedBuffer staging_h_;
  DeviceBuffer staging_d_;
  DeviceBuffer expert_map_d_;  // moe_keep_experts: ShardPlan::local_expert of every expert, uploaded once
  const dist::ShardPlan* expert_map_of_ = nullptr;
  size_t staging_bytes_ = 0;
  int64_t n_seqs_ = 0, page_stride_ = 0, n_tokens_ = 0, n_logits_ = 0;
  std::vector<int64_t> graph_key_;  // graph_key(), set by prepare (its capacity reused step to step)
};

}  // namespace k3::cuda
