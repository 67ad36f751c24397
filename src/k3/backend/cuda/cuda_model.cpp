// CudaModel (cuda_model.h): the one forward graph (model/graph/forward.h) over the CUDA backend
// (cuda_backend.h) on one GPU, with CUDA graphs for decode steps and sampling on the device.
//
// Per step: the backend stages the step's data on the host (one block, uploaded by one cudaMemcpyAsync
// at the start of the graph), every kernel goes on one stream, and the wanted logits (or the sampled ids)
// come back: one synchronisation per step. Scratch and workspaces are sized for the largest batch seen
// and reused (no allocation per step once warm).
#include "k3/backend/cuda/cuda_model.h"

#include "k3/dist/shard_plan.h"
#include "k3/model/model_files.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <span>

#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/device_cache.h"
#include "k3/backend/cuda/device_weights.h"
#include "k3/backend/cuda/logits_download.h"
#include "k3/backend/cuda/sampling_kernels.h"
#include "k3/backend/cuda/sampling_rows.h"
#include "k3/backend/cuda/step_graphs.h"
#include "k3/core/thread_pool.h"
#include "k3/io/safetensors.h"
#include "k3/model/expert_residency_setup.h"
#include "k3/model/graph/forward.h"
#include "k3/model/weights.h"

namespace k3::cuda {

namespace {

// Bytes of the routed experts whose home is the host (--cpu-moe, -ot exps=CPU).
int64_t routed_expert_bytes_on_host(const ModelWeights& w) {
  int64_t bytes = 0;
  for (const LayerWeights& L : w.layers)
    for (const GluMlp& e : L.moe.experts)
      for (const WeightMatrix* m : {&e.gate, &e.up, &e.down})
        if (!m->empty() && m->device == kHostDevice) bytes += m->bytes();
  return bytes;
}

std::string join_rules(const Placement& p) {
  std::string s;
  for (const std::string& r : p.describe()) s += (s.empty() ? "" : ", ") + r;
  return s;
}

}  // namespace

struct CudaModel::Impl {
  ModelConfig cfg;
  CacheSpec spec;
  std::unique_ptr<Checkpoint> host_ckpt;  // kept when weights are placed on the host (their views point into it)
  ModelWeights host_weights;              // (and into its aligned copies)
  std::unique_ptr<ExpertResidency> residency;  // over the host-placed routed experts (null: none or off)
  int device = 0;
  std::string name;
  DeviceWeights w;
  cudaStream_t stream = nullptr;
  std::shared_ptr<DeviceCacheMemory> mem;
  std::mutex mu;  // one forward at a time (the backend's scratch is shared)
  Profiler prof{std::getenv("K3_CUDA_PROFILE") != nullptr && std::string(std::getenv("K3_CUDA_PROFILE")) != "0"};
  std::unique_ptr<CudaBackend> backend;  // the graph's ops on this device
  LogitsDownload logits_down;
  bool use_graphs = true;
  bool host_experts = false;  // routed experts placed on the host: decode graphs are captured in pieces
  StepGraphs graphs;
  std::unique_ptr<dist::Communicator> comm;  // CudaLoadOptions::communicator (null: none)
  dist::ShardPlan shard;                     // one rank, collectives on: used when comm is set

  ~Impl() {
    prof.print();
    graphs.clear();
    backend.reset();
    comm.reset();  // before the stream its collectives are queued on
    if (stream) cudaStreamDestroy(stream);
  }

  // CudaLoadOptions::communicator: the communicator on this model's stream. Without a shard plan: one
  // rank, the sharded path at one rank (TP1 through the communicator); with one (load_shard): that rank.
  void attach_communicator(const CudaLoadOptions& opt, const dist::ShardPlan* plan = nullptr) {
    if (!opt.communicator) {
      if (plan && plan->sharded()) throw Error("CUDA backend: a shard of a model without a communicator");
      return;
    }
    comm = opt.communicator(stream);
    const int want = plan ? plan->size : 1;
    if (!comm || comm->size() != want || (plan && comm->rank() != plan->rank))
      throw Error("CUDA backend: a communicator of " + std::to_string(comm ? comm->size() : 0) + " ranks for " +
                  (plan ? "a shard of " + std::to_string(want) + " ranks" : std::string("a whole model (one rank)")));
    if (plan) {
      shard = *plan;
    } else {
      shard = dist::make_shard_plan(cfg, 0, 1, /*expert_parallel=*/false);
      shard.collectives_at_one_rank = true;
    }
    backend->set_communicator(comm.get());
  }

  void init(int dev, bool gemm_bf16) {
    device = dev;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw Error("--device cuda: no CUDA device is visible");
    if (dev >= n) throw Error("--device cuda:" + std::to_string(dev) + ": only " + std::to_string(n) + " CUDA device(s)");
    K3_CUDA_CHECK(cudaSetDevice(dev));
    cudaDeviceProp prop{};
    K3_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    if (prop.major < 9)
      throw Error(std::string("--device cuda: ") + prop.name + " is sm_" + std::to_string(prop.major * 10 + prop.minor) +
                  "; this build targets sm_90 (Hopper)");
    name = "cuda:" + std::to_string(dev) + " (" + prop.name + ")";
    K3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    backend = std::make_unique<CudaBackend>(cfg, spec, stream, gemm_bf16, prof);
    mem = std::make_shared<DeviceCacheMemory>(dev, stream);
    const ModelConfig& c = cfg;
    if (c.kda_heads > 0 && c.kda_head_dim != 32 && c.kda_head_dim != 64 && c.kda_head_dim != 128)
      throw Error("CUDA backend: KDA head_dim " + std::to_string(c.kda_head_dim) + " is not supported (32, 64, 128)");
    if (c.kv_lora_rank > 512) throw Error("CUDA backend: kv_lora_rank > 512 is not supported");
    if (spec.mla_layers > 0 && (c.kv_lora_rank % 4 != 0 || c.qk_rope_dim % 4 != 0))
      throw Error("CUDA backend: kv_lora_rank and qk_rope_dim must be multiples of 4");
    const int64_t n_blocks = c.attn_res_block_size > 0 ? (c.num_layers + c.attn_res_block_size - 1) / c.attn_res_block_size : 0;
    if (n_blocks + 1 > 32) throw Error("CUDA backend: more than 31 Attention-Residual blocks");
  }

  // One forward over `items` (the one graph over this device's backend), leaving the R wanted logits rows
  // in backend->logits(). `tail(R)` enqueues what the caller needs after the forward on the same stream
  // (copies, sampling); `done(R)` runs after the step's one synchronisation, before the caches advance.
  void forward(const std::vector<BatchItem>& items, const ForwardOptions& opt, const std::function<void(int64_t)>& tail,
               const std::function<void(int64_t)>& done);
  // One planned step (its caches as the plan holds them; not advanced): enqueue, tail, synchronise, done.
  void execute(const graph::StepPlan& plan, std::vector<float>* taps, const std::function<void(int64_t)>& tail,
               const std::function<void(int64_t)>& done);
  void run_graph(const graph::StepPlan& plan);
  void sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
              std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits, const ForwardOptions& opt);

  PinnedBuffer taps_h;  // the step's taps, downloaded tap-major (ForwardOptions::tap_layers)
  // GPU sampling's staging: row parameters + penalty ids up, results down.
  PinnedBuffer samp_h;
  DeviceBuffer samp_d;
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

std::unique_ptr<CudaModel> CudaModel::load(const std::string& dir, const CudaLoadOptions& opt) {
  auto impl = std::make_unique<Impl>();
  ModelFiles files = open_model_files(dir);  // an HF directory or a GGUF file
  impl->cfg = std::move(files.config);
  impl->spec = make_cache_spec(impl->cfg, opt.kv_cache_dtype, opt.ssm_cache_dtype);
  impl->init(opt.device, opt.gemm_bf16);
  impl->backend->set_moe_activation_dtype(opt.moe_activation);
  impl->attach_communicator(opt);
  impl->use_graphs = !opt.enforce_eager;
  std::unique_ptr<Checkpoint> ckpt = std::move(files.checkpoint);
  ModelWeights hw = bind_weights(impl->cfg, *ckpt, opt.placement.get(), opt.device);
  // One GPU per model so far: a rule naming another device would silently land on this one.
  for_each_matrix(hw, [&](const WeightMatrix& m) {
    if (!m.empty() && m.device != kHostDevice && m.device != opt.device)
      throw Error("--override-tensor: a rule places weights on CUDA" + std::to_string(m.device) + ", but this model runs on " +
                  impl->name + " only (placement across several GPUs is not supported yet)");
  });
  upload_weights(hw, opt.device, impl->w);
  const int64_t host_bytes = matrix_bytes_on(hw, kHostDevice);
  if (host_bytes > 0) {
    // Weights placed on the host stay in the mapping: keep it. Their ops run on the CPU between the GPU's
    // (moving activations): routed experts between the pieces of a captured decode graph (step_graphs.h);
    // host dense ops synchronise the stream, so with them there are no graphs.
    const int64_t expert_bytes = routed_expert_bytes_on_host(hw);
    impl->host_experts = expert_bytes > 0;
    const char* hybrid_graphs = std::getenv("K3_HYBRID_GRAPHS");  // "0": eager hybrid decode (to measure the graphs' gain)
    if (expert_bytes < host_bytes || (hybrid_graphs && std::string(hybrid_graphs) == "0")) impl->use_graphs = false;
    impl->host_ckpt = std::move(ckpt);
    impl->host_weights = std::move(hw);
    impl->residency = make_expert_residency(impl->host_weights, *impl->host_ckpt, opt.experts);
    impl->backend->set_host_expert_residency(impl->residency.get());
    // The CPU's expert jobs come one GPU layer apart: keep its workers spinning across that gap (a worker
    // woken from sleep arrives after the others have done its share: docs/perf/hybrid.md).
    ThreadPool::set_spin_time(std::chrono::microseconds(1000));
    std::fprintf(stderr, "k3: placement: %.2f GiB of weights on the CPU (%s), %.2f GiB on %s; CUDA graphs %s\n",
                 static_cast<double>(host_bytes) / (1 << 30), join_rules(*opt.placement).c_str(),
                 static_cast<double>(impl->w.arena.bytes()) / (1 << 30), impl->name.c_str(),
                 impl->use_graphs ? "on (in pieces around the host experts)"
                 : expert_bytes < host_bytes ? "off (dense weights on the host)" : "off");
  }  // else the host mapping is dropped: the device copy is all the forward needs
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

std::unique_ptr<CudaModel> CudaModel::load_dummy(const ModelConfig& cfg, const CudaLoadOptions& opt) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->spec = make_cache_spec(impl->cfg, opt.kv_cache_dtype, opt.ssm_cache_dtype);
  impl->init(opt.device, opt.gemm_bf16);
  impl->backend->set_moe_activation_dtype(opt.moe_activation);
  impl->attach_communicator(opt);
  impl->use_graphs = !opt.enforce_eager;
  if (opt.placement && !opt.placement->empty())
    throw Error("--override-tensor / --cpu-moe need a checkpoint (--load-format dummy generates weights on the GPU)");
  dummy_weights(impl->cfg, opt.dummy_seed, opt.device, impl->w);
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

std::unique_ptr<CudaModel> CudaModel::load_shard(const ModelConfig& shard_cfg, const ModelWeights& shard_weights,
                                                const dist::ShardPlan& plan, const CudaLoadOptions& opt) {
  if (opt.placement && !opt.placement->empty())
    throw Error("--override-tensor / --cpu-moe do not combine with --tensor-parallel-size on the GPU yet");
  auto impl = std::make_unique<Impl>();
  impl->cfg = shard_cfg;
  impl->spec = make_cache_spec(impl->cfg, opt.kv_cache_dtype, opt.ssm_cache_dtype);
  impl->init(opt.device, opt.gemm_bf16);
  impl->backend->set_moe_activation_dtype(opt.moe_activation);
  impl->attach_communicator(opt, &plan);
  impl->use_graphs = !opt.enforce_eager;
  upload_weights(shard_weights, opt.device, impl->w);
  for (const LayerWeights& L : impl->w.w.layers)  // the shard's expert bank: its slots (EP) or columns (TP)
    if (L.is_moe && !L.moe.stacked.empty()) {
      impl->backend->set_expert_shape(L.moe.stacked.E, L.moe.stacked.I);
      break;
    }
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

std::optional<ExpertCacheStats> CudaModel::expert_cache_stats() const {
  if (!impl_->residency) return std::nullopt;
  return impl_->residency->stats();
}

void CudaModel::forward_plan(const graph::StepPlan& plan, float* logits) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  K3_CUDA_CHECK(cudaSetDevice(m.device));
  const size_t row = static_cast<size_t>(m.cfg.vocab_size) * 4;
  m.execute(
      plan, nullptr,
      [&](int64_t R) {
        if (logits != nullptr && R > 0) m.logits_down.copy(m.backend->logits().data, static_cast<size_t>(R) * row, row, logits, m.stream);
      },
      [](int64_t) {});
}

const ModelConfig& CudaModel::config() const { return impl_->cfg; }
std::string CudaModel::device_name() const { return impl_->name; }
int64_t CudaModel::weight_bytes() const { return static_cast<int64_t>(impl_->w.arena.bytes()); }
const ModelWeights& CudaModel::device_weights() const { return impl_->w.w; }
int64_t CudaModel::graph_replays() const { return impl_->graphs.replays(); }
std::shared_ptr<CacheMemory> CudaModel::cache_memory() const { return impl_->mem; }

int64_t CudaModel::memory_available() const {
  K3_CUDA_CHECK(cudaSetDevice(impl_->device));
  size_t free_b = 0, total_b = 0;
  K3_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

void CudaModel::warm_up(int64_t max_tokens) const {
  if (max_tokens <= 0) return;
  const int64_t V = impl_->cfg.vocab_size;
  std::vector<int32_t> toks(static_cast<size_t>(max_tokens));
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + 1) % V);
  auto cache = new_cache();
  std::vector<float> logits;
  forward(toks, *cache, logits);
  sampling::RowSampling greedy;
  greedy.temperature = 0.0f;
  const RowSample row{greedy, false};
  std::vector<sampling::SampleResult> res;
  std::vector<float> raw;
  forward_sample({BatchItem{std::span<const int32_t>(toks.data(), 1), cache.get(), true}}, std::span<const RowSample>(&row, 1),
                 res, raw);
}

const CacheSpec& CudaModel::cache_spec() const { return impl_->spec; }

std::unique_ptr<SequenceCache> CudaModel::new_cache() const {
  K3_CUDA_CHECK(cudaSetDevice(impl_->device));
  return std::make_unique<DeviceSequence>(impl_->spec, impl_->stream);
}

void CudaModel::forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                              const ForwardOptions& opt) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  const int64_t V = m.cfg.vocab_size;
  m.forward(
      items, opt,
      [&](int64_t R) {
        // The rows are copied out while the step's stream drains (LogitsDownload: pieces, host copy on
        // the CPU pool overlapping the PCIe copy of the next piece).
        logits.resize(static_cast<size_t>(R * V));
        if (R > 0)
          m.logits_down.copy(m.backend->logits().data, logits.size() * 4, static_cast<size_t>(V) * 4, logits.data(),
                             m.stream);
      },
      [](int64_t) {});
}

void CudaModel::forward_sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                               std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits,
                               const ForwardOptions& opt) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->sample(items, rows, results, raw_logits, opt);
}

void CudaModel::Impl::sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                             std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits,
                             const ForwardOptions& opt) {
  check_forward_sample_args(items, rows, opt);
  const int64_t V = cfg.vocab_size;
  const int R = static_cast<int>(rows.size());
  // Parameters, penalty ids and constraints (logit_bias, grammar masks), one upload:
  // [rows][ids][constraint rows][bias ids][bias values][mask words][results].
  std::vector<sampling::RowSampling> rs;
  for (const RowSample& r : rows) rs.push_back(r.sampling);
  std::vector<DeviceRowSampling> drows;
  std::vector<int32_t> ids;
  flatten_rows(rs, drows, ids);
  FlatConstraints cons;
  const bool constrained = flatten_constraints(rs, V, cons);
  auto al16 = [](size_t b) { return (b + 15) / 16 * 16; };
  const size_t rows_b = drows.size() * sizeof(DeviceRowSampling), ids_b = al16(ids.size() * 4);
  const size_t crow_b = al16(cons.rows.size() * sizeof(DeviceRowConstraint)), cid_b = al16(cons.bias_ids.size() * 4),
               cval_b = al16(cons.bias_values.size() * 4), cmask_b = al16(cons.mask.size() * 4);
  const size_t con_b = crow_b + cid_b + cval_b + cmask_b;
  const size_t up_b = rows_b + ids_b + con_b;  // what goes up; the results follow it
  const size_t res_b = static_cast<size_t>(R) * sizeof(DeviceSampleResult);
  int n_raw = 0;
  for (const RowSample& r : rows) n_raw += r.raw_logits ? 1 : 0;
  const size_t raw_b = static_cast<size_t>(n_raw) * static_cast<size_t>(V) * 4;
  uint8_t* h = static_cast<uint8_t*>(samp_h.ensure(up_b + res_b + raw_b));
  if (samp_d.bytes() < up_b + res_b) samp_d = DeviceBuffer(2 * (up_b + res_b) + 4096);
  std::memcpy(h, drows.data(), rows_b);
  if (!ids.empty()) std::memcpy(h + rows_b, ids.data(), ids.size() * 4);
  const size_t c0 = rows_b + ids_b;
  if (constrained) {
    std::memcpy(h + c0, cons.rows.data(), cons.rows.size() * sizeof(DeviceRowConstraint));
    if (!cons.bias_ids.empty()) {
      std::memcpy(h + c0 + crow_b, cons.bias_ids.data(), cons.bias_ids.size() * 4);
      std::memcpy(h + c0 + crow_b + cid_b, cons.bias_values.data(), cons.bias_values.size() * 4);
    }
    if (!cons.mask.empty()) std::memcpy(h + c0 + crow_b + cid_b + cval_b, cons.mask.data(), cons.mask.size() * 4);
  }
  uint8_t* d = samp_d.get<uint8_t>();
  forward(
      items, opt,
      [&](int64_t) {
        // The raw rows first: the kernels rewrite the logits in place.
        int j_raw = 0;
        for (int j = 0; j < R; ++j)
          if (rows[static_cast<size_t>(j)].raw_logits)
            K3_CUDA_CHECK(cudaMemcpyAsync(h + up_b + res_b + static_cast<size_t>(j_raw++) * V * 4,
                                          backend->logits().f() + static_cast<int64_t>(j) * V, static_cast<size_t>(V) * 4,
                                          cudaMemcpyDeviceToHost, stream));
        K3_CUDA_CHECK(cudaMemcpyAsync(d, h, up_b, cudaMemcpyHostToDevice, stream));
        if (constrained)
          K3_CUDA_CHECK(constrain_rows(backend->logits().f(), V, reinterpret_cast<const DeviceRowConstraint*>(d + c0),
                                       reinterpret_cast<const int32_t*>(d + c0 + crow_b),
                                       reinterpret_cast<const float*>(d + c0 + crow_b + cid_b),
                                       reinterpret_cast<const uint32_t*>(d + c0 + crow_b + cid_b + cval_b), R, stream));
        K3_CUDA_CHECK(sample_rows(backend->logits().f(), V, reinterpret_cast<const DeviceRowSampling*>(d),
                                  reinterpret_cast<const int32_t*>(d + rows_b), R,
                                  reinterpret_cast<DeviceSampleResult*>(d + up_b), stream));
        K3_CUDA_CHECK(cudaMemcpyAsync(h + up_b, d + up_b, res_b, cudaMemcpyDeviceToHost, stream));
      },
      [&](int64_t) {
        results.resize(static_cast<size_t>(R));
        const auto* out = reinterpret_cast<const DeviceSampleResult*>(h + up_b);
        for (int j = 0; j < R; ++j) results[static_cast<size_t>(j)] = to_result(out[j]);
        raw_logits.resize(static_cast<size_t>(n_raw) * static_cast<size_t>(V));
        if (n_raw > 0) std::memcpy(raw_logits.data(), h + up_b + res_b, raw_b);
      });
}

void CudaModel::Impl::forward(const std::vector<BatchItem>& items, const ForwardOptions& opt,
                              const std::function<void(int64_t)>& tail, const std::function<void(int64_t)>& done) {
  K3_CUDA_CHECK(cudaSetDevice(device));
  check_tap_layers(opt, cfg.num_layers);
  const graph::StepPlan plan = graph::plan_step(items, opt, cfg.vocab_size, spec);
  execute(plan, opt.taps, tail, done);
  graph::finish_step(plan);
}

void CudaModel::Impl::execute(const graph::StepPlan& plan, std::vector<float>* taps,
                              const std::function<void(int64_t)>& tail, const std::function<void(int64_t)>& done) {
  backend->prepare(plan);
  run_graph(plan);
  const int64_t R = plan.n_logits(), T = static_cast<int64_t>(plan.tap_layers.size()), H = cfg.hidden_size;
  tail(R);
  const size_t tap_bytes = static_cast<size_t>(T * R * H) * 4;
  if (tap_bytes > 0)
    K3_CUDA_CHECK(cudaMemcpyAsync(taps_h.ensure(tap_bytes), backend->taps().data, tap_bytes, cudaMemcpyDeviceToHost, stream));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream));
  prof.collect();
  if (tap_bytes > 0) taps_to_rows(static_cast<const float*>(taps_h.ensure(tap_bytes)), T, R, H, *taps);
  done(R);
}

// Enqueues the step: decode steps replay captured CUDA graphs (step_graphs.h); prefill, mixed steps and
// batches that stream host experts to the GPU (packed on the host first) run eagerly.
void CudaModel::Impl::run_graph(const graph::StepPlan& plan) {
  auto enqueue = [&] {
    graph::forward(cfg, w.w, *backend, plan, backend->logits(), comm ? &shard : nullptr, backend->taps());
  };
  const bool streams = host_experts && backend->moe_stream_min_tokens() > 0 &&
                       plan.n_tokens() >= backend->moe_stream_min_tokens();
  // Decode-form steps whose every row is a logits row: decode steps, and speculative verification steps
  // (a pending token + drafts per sequence; graph_key() tells their shapes apart).
  const bool graphable = use_graphs && !streams && !prof.on() && !plan.any_prefill_form() && plan.n_logits() == plan.n_tokens();
  if (!graphable) return enqueue();
  graphs.run(backend->graph_key(), *backend, stream, host_experts, enqueue);
}

}  // namespace k3::cuda
