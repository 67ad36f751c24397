// CudaModel (cuda_model.h): the forward graph of model/model.cpp on the GPU.
//
// Per step the host builds one staging block (token ids, token -> sequence/position maps, the MLA page
// tables of every layer, the KDA state descriptors of every layer, the Attention-Residual source
// lists), copies it to the device with one cudaMemcpyAsync, enqueues every kernel on one stream and
// copies the wanted logits back: one synchronisation per step. Activation buffers are sized for the
// largest batch seen and reused (no allocation per step once warm).
#include "k3/backend/cuda/cuda_model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/device_cache.h"
#include "k3/backend/cuda/device_weights.h"
#include "k3/backend/cuda/kda_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/mla_kernels.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/backend/cuda/sampling_kernels.h"
#include "k3/backend/cuda/sampling_rows.h"
#include "k3/io/safetensors.h"
#include "k3/model/weights.h"

namespace k3::cuda {

namespace {

// Pinned host memory that grows.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  void* ensure(size_t bytes) {
    if (bytes > cap_) {
      if (p_) cudaFreeHost(p_);
      p_ = nullptr;
      cap_ = std::max(bytes, cap_ * 2);
      K3_CUDA_CHECK(cudaMallocHost(&p_, cap_));
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

// Host-side builder of the staging block: items appended at 16-byte-aligned offsets.
class Staging {
 public:
  template <typename T>
  size_t put(const T* data, size_t count) {
    const size_t off = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(off + count * sizeof(T));
    if (count) std::memcpy(bytes_.data() + off, data, count * sizeof(T));
    return off;
  }
  template <typename T>
  size_t put(const std::vector<T>& v) { return put(v.data(), v.size()); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  void clear() { bytes_.clear(); }

 private:
  std::vector<uint8_t> bytes_;
};

// Per-category GPU time of the eager path (K3_CUDA_PROFILE=1): cudaEvent pairs around each region,
// summed after the step's synchronisation and printed when the model is destroyed.
class Profiler {
 public:
  explicit Profiler(bool on) : on_(on) {}
  ~Profiler() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  bool on() const { return on_; }
  void begin(const char* cat, cudaStream_t s) {
    if (!on_) return;
    open_.push_back({cat, event(), nullptr});
    cudaEventRecord(open_.back().a, s);
  }
  void end(cudaStream_t s) {
    if (!on_) return;
    open_.back().b = event();
    cudaEventRecord(open_.back().b, s);
    done_.push_back(open_.back());
    open_.pop_back();
  }
  // After the stream is synchronised.
  void collect() {
    for (auto& r : done_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, r.a, r.b);
      auto& t = totals_[r.cat];
      t.first += ms;
      t.second += 1;
      free_.push_back(r.a);
      free_.push_back(r.b);
    }
    done_.clear();
  }
  void print() const {
    if (!on_ || totals_.empty()) return;
    double all = 0;
    for (auto& [k, v] : totals_) all += v.first;
    std::fprintf(stderr, "k3 cuda profile (eager path; GPU time per region):\n");
    for (auto& [k, v] : totals_)
      std::fprintf(stderr, "  %-14s %10.3f ms  %5.1f%%  %8lld calls\n", k.c_str(), v.first, 100.0 * v.first / all,
                   static_cast<long long>(v.second));
  }

 private:
  struct Region {
    const char* cat;
    cudaEvent_t a, b;
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e;
    cudaEventCreate(&e);
    pool_.push_back(e);
    return e;
  }
  bool on_;
  std::vector<Region> open_, done_;
  std::vector<cudaEvent_t> pool_, free_;
  std::map<std::string, std::pair<double, int64_t>> totals_;
};

// Decode steps replayed as CUDA graphs, keyed by (sequences, page-table stride). A key is captured the
// second time it is seen (the first, eager run sizes every lazily grown buffer); any reallocation of a
// buffer a graph refers to bumps `generation` and drops the graphs.
struct GraphCache {
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;
  };
  std::map<std::pair<int64_t, int64_t>, Entry> graphs;
  std::set<std::pair<int64_t, int64_t>> seen;
  uint64_t generation = 1;
  ~GraphCache() { clear(); }
  void clear() {
    for (auto& [k, e] : graphs)
      if (e.exec) cudaGraphExecDestroy(e.exec);
    graphs.clear();
  }
};

}  // namespace

struct CudaModel::Impl {
  ModelConfig cfg;
  int device = 0;
  std::string name;
  DeviceWeights w;
  cudaStream_t stream = nullptr;
  std::unique_ptr<LinearRunner> lin;
  std::shared_ptr<DeviceCacheMemory> mem;
  std::mutex mu;  // one forward at a time (the scratch below is shared)

  // Activations, sized for `cap` tokens.
  int64_t cap = 0;
  DeviceBuffer act;
  float *P = nullptr, *h = nullptr, *xin = nullptr, *tmp = nullptr, *sh = nullptr, *blocks = nullptr;
  float *pq = nullptr, *pk = nullptr, *pv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr,
        *o = nullptr, *gate = nullptr, *fa = nullptr, *beta = nullptr;
  float *qa = nullptr, *mq = nullptr, *lat = nullptr, *ql = nullptr, *ol = nullptr, *mo = nullptr, *mg = nullptr;
  float* attn_ws = nullptr;  // split-key partials of the MLA decode attention (mla_attend_workspace_floats)
  float *rl = nullptr, *wts = nullptr, *z = nullptr, *acc = nullptr, *ga = nullptr, *ua = nullptr, *hs = nullptr;
  int32_t* idx = nullptr;
  std::unique_ptr<MoeWorkspace> moe_ws;
  DeviceBuffer kda_ws;  // kda_chunked's workspace for `cap` tokens
  int64_t n_blocks_max = 0;
  DeviceBuffer logits_d;
  PinnedBuffer staging_h, logits_h;
  DeviceBuffer staging_d;
  Staging st;
  Profiler prof{std::getenv("K3_CUDA_PROFILE") != nullptr && std::string(std::getenv("K3_CUDA_PROFILE")) != "0"};
  bool use_graphs = true;
  bool gemm_bf16 = false;
  GraphCache graphs;

  ~Impl() {
    prof.print();
    graphs.clear();
    lin.reset();
    if (stream) cudaStreamDestroy(stream);
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
    lin = std::make_unique<LinearRunner>(stream, gemm_bf16 ? GemmPrecision::Bf16 : GemmPrecision::Bf16x2);
    this->gemm_bf16 = gemm_bf16;
    mem = std::make_shared<DeviceCacheMemory>(dev, stream);
    const ModelConfig& c = cfg;
    if (c.kda_heads > 0 && c.kda_head_dim != 32 && c.kda_head_dim != 64 && c.kda_head_dim != 128)
      throw Error("CUDA backend: KDA head_dim " + std::to_string(c.kda_head_dim) + " is not supported (32, 64, 128)");
    if (c.kv_lora_rank > 512) throw Error("CUDA backend: kv_lora_rank > 512 is not supported");
    n_blocks_max = c.attn_res_block_size > 0 ? (c.num_layers + c.attn_res_block_size - 1) / c.attn_res_block_size : 0;
    if (n_blocks_max + 1 > 32) throw Error("CUDA backend: more than 31 Attention-Residual blocks");
  }

  void ensure(int64_t N) {
    if (N <= cap) return;
    const ModelConfig& c = cfg;
    const int64_t n = std::max<int64_t>((N + 63) / 64 * 64, cap * 2);
    const int64_t H = c.hidden_size, C = c.kda_heads * c.kda_head_dim, r = c.kda_gate_rank, Hk = c.kda_heads;
    const int64_t nh = c.mla_heads, qk = c.mla_qk_dim(), cd = c.mla_cache_dim(), kr = c.kv_lora_rank, dv = c.v_head_dim;
    const int64_t E = c.num_experts, K = c.top_k, X = c.expert_in_dim();
    const int64_t I = std::max<int64_t>(c.intermediate_size, c.moe_intermediate_size * std::max<int64_t>(c.num_shared_experts, 1));
    std::vector<std::pair<float**, int64_t>> parts = {
        {&P, n * H}, {&h, n * H}, {&xin, n * H}, {&tmp, n * H}, {&sh, n * H}, {&hs, n * H},
        {&blocks, std::max<int64_t>(n_blocks_max, 1) * n * H},
        {&pq, n * C}, {&pk, n * C}, {&pv, n * C}, {&q, n * C}, {&k, n * C}, {&v, n * C}, {&g, n * C}, {&o, n * C},
        {&gate, n * C}, {&fa, n * std::max<int64_t>(r, 1)}, {&beta, n * std::max<int64_t>(Hk, 1)},
        {&qa, n * std::max<int64_t>(c.q_lora_rank, 1)}, {&mq, n * nh * qk}, {&lat, n * cd}, {&ql, n * nh * cd},
        {&ol, n * nh * kr}, {&mo, n * nh * dv}, {&mg, n * nh * dv},
        {&rl, n * std::max<int64_t>(E, 1)}, {&wts, n * std::max<int64_t>(K, 1)}, {&z, n * X}, {&acc, n * X},
        {&ga, n * I}, {&ua, n * I}, {&attn_ws, static_cast<int64_t>(mla_attend_workspace_floats_max(static_cast<int>(n),
                                                                          static_cast<int>(std::max<int64_t>(nh, 1)),
                                                                          static_cast<int>(kr)))}};
    size_t total = 0;
    for (auto& p : parts) total += static_cast<size_t>((p.second + 63) / 64 * 64);
    total += static_cast<size_t>(n * std::max<int64_t>(K, 1));  // idx (int32, same size as float)
    act = DeviceBuffer();
    act = DeviceBuffer(total * 4);
    ++graphs.generation;
    float* base = act.get<float>();
    for (auto& p : parts) {
      *p.first = base;
      base += (p.second + 63) / 64 * 64;
    }
    idx = reinterpret_cast<int32_t*>(base);
    if (c.kda_heads > 0) {
      size_t kb = 0;
      for (int ch : {16, 32, 64})
        kb = std::max(kb, kda_chunked_workspace_bytes(static_cast<int>(n), static_cast<int>(n), static_cast<int>(Hk),
                                                      static_cast<int>(c.kda_head_dim), ch));
      kda_ws = DeviceBuffer();
      kda_ws = DeviceBuffer(kb);
    }
    if (E > 0) {
      moe_ws.reset();
      moe_ws = std::make_unique<MoeWorkspace>(static_cast<int>(n), static_cast<int>(K), static_cast<int>(E),
                                              static_cast<int>(c.moe_intermediate_size), static_cast<int>(X));
    }
    cap = n;
  }

  template <typename T>
  T* dptr(size_t off) const { return reinterpret_cast<T*>(staging_d.get<uint8_t>() + off); }

  void linear(const DeviceLinear& W, const float* x, int64_t n, float* y) { lin->run(W, x, n, y); }

  void glu_mlp(const DGlu& m, const float* x, int64_t n, float* out) {
    const int64_t I = m.gate.rows;
    linear(m.gate, x, n, ga);
    linear(m.up, x, n, ua);
    K3_CUDA_CHECK(cuda::glu(ga, ua, n * I, cfg.act == Activation::SiTU, cfg.situ_beta, cfg.situ_linear_beta, stream));
    linear(m.down, ga, n, out);
  }

  // One forward over `items`, leaving the R wanted logits rows in logits_d. `tail(R)` enqueues what
  // the caller needs after the forward on the same stream (copies, sampling); `done(R)` runs after the
  // step's one synchronisation, before the caches advance.
  void forward(const std::vector<BatchItem>& items, const ForwardOptions& opt, const std::function<void(int64_t)>& tail,
               const std::function<void(int64_t)>& done);
  void sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
              std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits, const ForwardOptions& opt);

  // GPU sampling's staging: row parameters + penalty ids up, results down.
  PinnedBuffer samp_h;
  DeviceBuffer samp_d;

  // MHA (prefill) form for one sequence's n new tokens at positions past..past+n-1: k_nope / v for all
  // S = past + n cached tokens are expanded from the latents (one SGEMM), then per query chunk the
  // scores (two batched SGEMMs: nope part + the shared rope-slot part), a causal softmax, and P.V.
  // fp32 throughout (the CPU reference uses the same form for prefill). Writes mo rows [offset, offset+n).
  DeviceBuffer mha_ws;
  void mla_prefill_mha(const DMla& M, const MlaPaging& pg, int seq, int64_t offset, int64_t n, int64_t past, float* out) {
    const ModelConfig& c = cfg;
    const int nh = static_cast<int>(c.mla_heads), dn = static_cast<int>(c.qk_nope_dim), dr = static_cast<int>(c.qk_rope_dim),
              dv = static_cast<int>(c.v_head_dim), kr = static_cast<int>(c.kv_lora_rank);
    const int qk = dn + dr, cd = kr + dr, Rw = nh * (dn + dv);
    const int64_t S = past + n;
    const int64_t budget = int64_t{64} << 20;  // floats of scores per chunk (256 MiB)
    const int64_t Tq = std::max<int64_t>(1, std::min<int64_t>(n, budget / (int64_t{nh} * S)));
    const size_t need = static_cast<size_t>(S * cd + S * Rw + int64_t{nh} * Tq * S) * 4;
    if (mha_ws.bytes() < need) {
      K3_CUDA_CHECK(cudaStreamSynchronize(stream));  // queued work may still use the old buffer
      mha_ws = DeviceBuffer(need + need / 4);
    }
    float* Lc = mha_ws.get<float>();
    float* KV = Lc + S * cd;
    float* sc = KV + S * Rw;
    K3_CUDA_CHECK(mla_gather_latents(pg, seq, static_cast<int>(S), Lc, stream));
    const float one = 1.f, zero = 0.f, scale = 1.0f / std::sqrt(static_cast<float>(qk));
    cublasHandle_t hb = lin->cublas();
    check_cublas(cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, Rw, static_cast<int>(S), kr, &one, M.kv_b, kr, Lc, cd, &zero, KV, Rw),
                 "MLA k/v expansion");
    for (int64_t t0 = 0; t0 < n; t0 += Tq) {
      const int tq = static_cast<int>(std::min<int64_t>(Tq, n - t0));
      const float* Q = mq + (offset + t0) * nh * qk;
      const long long sstride = static_cast<long long>(tq) * S;
      check_cublas(cublasSgemmStridedBatched(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(S), tq, dn, &scale, KV, Rw, dn + dv, Q,
                                             nh * qk, qk, &zero, sc, static_cast<int>(S), sstride, nh),
                   "MLA scores (nope)");
      check_cublas(cublasSgemmStridedBatched(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(S), tq, dr, &scale, Lc + kr, cd, 0,
                                             Q + dn, nh * qk, qk, &one, sc, static_cast<int>(S), sstride, nh),
                   "MLA scores (rope slot)");
      K3_CUDA_CHECK(mla_causal_softmax(sc, nh, tq, static_cast<int>(S), static_cast<int>(past + t0), stream));
      check_cublas(cublasSgemmStridedBatched(hb, CUBLAS_OP_N, CUBLAS_OP_N, dv, tq, static_cast<int>(S), &one, KV + dn, Rw, dn + dv,
                                             sc, static_cast<int>(S), sstride, &zero, out + (offset + t0) * nh * dv, nh * dv, dv,
                                             nh),
                   "MLA P.V");
    }
  }
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

std::unique_ptr<CudaModel> CudaModel::load(const std::string& dir, const CudaLoadOptions& opt) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = load_model_config(dir);
  impl->init(opt.device, opt.gemm_bf16);
  impl->use_graphs = !opt.enforce_eager;
  {
    Checkpoint ckpt(dir);
    ModelWeights hw = bind_weights(impl->cfg, ckpt);
    upload_weights(hw, impl->w);
  }  // the host mapping is dropped: the device copy is all the forward needs
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

std::unique_ptr<CudaModel> CudaModel::load_dummy(const ModelConfig& cfg, const CudaLoadOptions& opt) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  impl->init(opt.device, opt.gemm_bf16);
  impl->use_graphs = !opt.enforce_eager;
  dummy_weights(impl->cfg, opt.dummy_seed, impl->w);
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

const ModelConfig& CudaModel::config() const { return impl_->cfg; }
std::string CudaModel::device_name() const { return impl_->name; }
int64_t CudaModel::weight_bytes() const { return static_cast<int64_t>(impl_->w.arena.bytes()); }
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

std::unique_ptr<SequenceCache> CudaModel::new_cache() const {
  K3_CUDA_CHECK(cudaSetDevice(impl_->device));
  return std::make_unique<DeviceSequence>(impl_->cfg, impl_->stream);
}

void CudaModel::forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                              const ForwardOptions& opt) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  const int64_t V = m.cfg.vocab_size;
  void* host = nullptr;
  m.forward(
      items, opt,
      [&](int64_t R) {
        const size_t bytes = static_cast<size_t>(R * V) * 4;
        host = m.logits_h.ensure(bytes);
        if (R > 0) K3_CUDA_CHECK(cudaMemcpyAsync(host, m.logits_d.get(), bytes, cudaMemcpyDeviceToHost, m.stream));
      },
      [&](int64_t R) {
        logits.resize(static_cast<size_t>(R * V));
        if (R > 0) std::memcpy(logits.data(), host, logits.size() * 4);
      });
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
  // Parameters and penalty ids, one upload: [rows][ids][results].
  std::vector<sampling::RowSampling> rs;
  for (const RowSample& r : rows) rs.push_back(r.sampling);
  std::vector<DeviceRowSampling> drows;
  std::vector<int32_t> ids;
  flatten_rows(rs, drows, ids);
  const size_t rows_b = drows.size() * sizeof(DeviceRowSampling), ids_b = (ids.size() * 4 + 15) / 16 * 16,
               res_b = static_cast<size_t>(R) * sizeof(DeviceSampleResult);
  int n_raw = 0;
  for (const RowSample& r : rows) n_raw += r.raw_logits ? 1 : 0;
  const size_t raw_b = static_cast<size_t>(n_raw) * static_cast<size_t>(V) * 4;
  uint8_t* h = static_cast<uint8_t*>(samp_h.ensure(rows_b + ids_b + res_b + raw_b));
  if (samp_d.bytes() < rows_b + ids_b + res_b) samp_d = DeviceBuffer(2 * (rows_b + ids_b + res_b) + 4096);
  std::memcpy(h, drows.data(), rows_b);
  if (!ids.empty()) std::memcpy(h + rows_b, ids.data(), ids.size() * 4);
  uint8_t* d = samp_d.get<uint8_t>();
  forward(
      items, opt,
      [&](int64_t) {
        // The raw rows first: the kernel rewrites the logits in place.
        int j_raw = 0;
        for (int j = 0; j < R; ++j)
          if (rows[static_cast<size_t>(j)].raw_logits)
            K3_CUDA_CHECK(cudaMemcpyAsync(h + rows_b + ids_b + res_b + static_cast<size_t>(j_raw++) * V * 4,
                                          logits_d.get<float>() + static_cast<int64_t>(j) * V, static_cast<size_t>(V) * 4,
                                          cudaMemcpyDeviceToHost, stream));
        K3_CUDA_CHECK(cudaMemcpyAsync(d, h, rows_b + ids_b, cudaMemcpyHostToDevice, stream));
        K3_CUDA_CHECK(sample_rows(logits_d.get<float>(), V, reinterpret_cast<const DeviceRowSampling*>(d),
                                  reinterpret_cast<const int32_t*>(d + rows_b), R,
                                  reinterpret_cast<DeviceSampleResult*>(d + rows_b + ids_b), stream));
        K3_CUDA_CHECK(cudaMemcpyAsync(h + rows_b + ids_b, d + rows_b + ids_b, res_b, cudaMemcpyDeviceToHost, stream));
      },
      [&](int64_t) {
        results.resize(static_cast<size_t>(R));
        const auto* out = reinterpret_cast<const DeviceSampleResult*>(h + rows_b + ids_b);
        for (int j = 0; j < R; ++j) results[static_cast<size_t>(j)] = to_result(out[j]);
        raw_logits.resize(static_cast<size_t>(n_raw) * static_cast<size_t>(V));
        if (n_raw > 0) std::memcpy(raw_logits.data(), h + rows_b + ids_b + res_b, raw_b);
      });
}

void CudaModel::Impl::forward(const std::vector<BatchItem>& items, const ForwardOptions& opt,
                              const std::function<void(int64_t)>& tail, const std::function<void(int64_t)>& done) {
  const ModelConfig& c = cfg;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = c.rms_norm_eps;
  K3_CUDA_CHECK(cudaSetDevice(device));

  // ---- the batch on the host ----
  struct Seq {
    int64_t offset, n, past;
    SequenceCache* cache;
    bool prefill;
  };
  std::vector<Seq> seqs;
  std::vector<int32_t> tokens, tok_seq, tok_pos;
  for (const BatchItem& it : items) {
    check_batch_tokens(it, V);
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    const bool prefill = takes_prefill_form(opt.path, n);
    seqs.push_back({static_cast<int64_t>(tokens.size()), n, it.cache->n_past(), it.cache, prefill});
    for (int64_t t = 0; t < n; ++t) {
      tok_seq.push_back(static_cast<int32_t>(seqs.size() - 1));
      tok_pos.push_back(static_cast<int32_t>(seqs.back().past + t));
    }
    tokens.insert(tokens.end(), it.tokens.begin(), it.tokens.end());
  }
  if (seqs.empty()) throw Error("forward: empty batch");
  for (const Seq& s : seqs) s.cache->reserve(s.n);
  const int64_t N = static_cast<int64_t>(tokens.size());
  const int64_t S = static_cast<int64_t>(seqs.size());
  ensure(N);

  // Rows whose logits are wanted.
  std::vector<int32_t> rows;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].want_logits) continue;
    for (int64_t t = opt.all_logits ? 0 : seqs[i].n - 1; t < seqs[i].n; ++t) rows.push_back(static_cast<int32_t>(seqs[i].offset + t));
  }
  const int64_t R = static_cast<int64_t>(rows.size());

  // ---- staging ----
  st.clear();
  const size_t o_tokens = st.put(tokens), o_tseq = st.put(tok_seq), o_tpos = st.put(tok_pos), o_rows = st.put(rows);
  // MLA page tables (one pointer per page per layer; same page count for every layer).
  const int64_t n_mla = c.num_mla_layers(), n_kda = c.num_kda_layers();
  std::vector<int32_t> page_start(static_cast<size_t>(S)), page_tokens(static_cast<size_t>(S));
  std::vector<size_t> o_pages(static_cast<size_t>(n_mla));
  // Each sequence's pages start at a multiple of `stride` (the largest page count rounded up to a power
  // of two), so that decode steps of one batch size keep one staging layout (CUDA graphs).
  int64_t stride = 4;
  {
    for (int64_t i = 0; i < S; ++i) {
      const Seq& s = seqs[static_cast<size_t>(i)];
      const int64_t B = std::min<int64_t>(s.cache->mla_page_tokens(), s.past + s.n);
      while (stride < (s.past + s.n + B - 1) / B) stride *= 2;
    }
    for (int64_t i = 0; i < S; ++i) {
      page_start[static_cast<size_t>(i)] = static_cast<int32_t>(i * stride);
      page_tokens[static_cast<size_t>(i)] =
          static_cast<int32_t>(std::min<int64_t>(seqs[static_cast<size_t>(i)].cache->mla_page_tokens(), int64_t{1} << 30));
    }
    std::vector<const float*> ptrs(static_cast<size_t>(S * stride), nullptr);
    for (int64_t m = 0; m < n_mla; ++m) {
      for (int64_t i = 0; i < S; ++i) {
        const Seq& s = seqs[static_cast<size_t>(i)];
        const int64_t B = std::min<int64_t>(s.cache->mla_page_tokens(), s.past + s.n);
        const int64_t np = (s.past + s.n + B - 1) / B;
        for (int64_t j = 0; j < np; ++j) ptrs[static_cast<size_t>(page_start[static_cast<size_t>(i)] + j)] = s.cache->mla_row(m, j * B);
      }
      o_pages[static_cast<size_t>(m)] = st.put(ptrs);
    }
  }
  const size_t o_pstart = st.put(page_start), o_ptok = st.put(page_tokens);
  // KDA descriptors per layer: all sequences, then the split into recurrent / chunked sets.
  // Chunk 32 measured fastest on the H200 at 1 x 4096 tokens (1.17 ms vs 1.37 for 64; docs/perf/cuda.md);
  // other sizes than 16/32/64 fall back to the recurrence.
  const int kda_chunk = opt.kda_chunk > 0 ? opt.kda_chunk : 32;
  const bool chunk_ok = kda_chunk == 16 || kda_chunk == 32 || kda_chunk == 64;
  bool all_decode = true;
  for (const Seq& s : seqs) all_decode = all_decode && s.n == 1 && !s.prefill;
  std::vector<size_t> o_kall(static_cast<size_t>(n_kda)), o_krec(static_cast<size_t>(n_kda)), o_kchk(static_cast<size_t>(n_kda));
  int n_rec = 0, n_chk = 0;
  for (int64_t li = 0; li < n_kda; ++li) {
    std::vector<KdaSeq> all, rec, chk;
    for (const Seq& s : seqs) {
      const KdaStateView v = s.cache->kda_state(li);
      const KdaSeq d{v.S, v.conv_q, v.conv_k, v.conv_v, static_cast<int32_t>(s.offset), static_cast<int32_t>(s.n)};
      all.push_back(d);
      (s.prefill && chunk_ok ? chk : rec).push_back(d);
    }
    n_rec = static_cast<int>(rec.size());
    n_chk = static_cast<int>(chk.size());
    o_kall[static_cast<size_t>(li)] = st.put(all);
    o_krec[static_cast<size_t>(li)] = st.put(rec);
    o_kchk[static_cast<size_t>(li)] = st.put(chk);
  }
  // Tokens of decode-form sequences (absorbed MLA); prefill-form sequences take the MHA form.
  std::vector<int32_t> dec_tokens;
  std::vector<size_t> prefill_seqs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].prefill)
      prefill_seqs.push_back(i);
    else
      for (int64_t t = 0; t < seqs[i].n; ++t) dec_tokens.push_back(static_cast<int32_t>(seqs[i].offset + t));
  }
  const size_t o_dectok = st.put(dec_tokens);
  const int n_dec_tok = static_cast<int>(dec_tokens.size());
  // Attention-Residual sources: for nb completed blocks, [B_0 .. B_{nb-1}, P].
  std::vector<size_t> o_src(static_cast<size_t>(n_blocks_max + 1));
  for (int64_t nb = 1; nb <= n_blocks_max; ++nb) {
    std::vector<const float*> src;
    for (int64_t b = 0; b < nb; ++b) src.push_back(blocks + b * N * H);
    src.push_back(P);
    o_src[static_cast<size_t>(nb)] = st.put(src);
  }
  const size_t sbytes = st.bytes().size();
  if (staging_d.bytes() < sbytes) {
    staging_d = DeviceBuffer(std::max(sbytes, staging_d.bytes() * 2));
    ++graphs.generation;
  }
  void* const staging_before = staging_h.ensure(0);
  void* const staging_host = staging_h.ensure(sbytes);
  if (staging_host != staging_before) ++graphs.generation;
  std::memcpy(staging_host, st.bytes().data(), sbytes);
  const size_t lbytes = static_cast<size_t>(R * V) * 4;
  if (logits_d.bytes() < lbytes) {
    logits_d = DeviceBuffer(lbytes);
    ++graphs.generation;
  }

  auto paging = [&](int64_t m) {
    return MlaPaging{dptr<const float* const>(o_pages[static_cast<size_t>(m)]), dptr<const int32_t>(o_pstart),
                     dptr<const int32_t>(o_ptok), dptr<const int32_t>(o_tseq), dptr<const int32_t>(o_tpos),
                     static_cast<int>(c.mla_cache_dim())};
  };

  // ---- the device work of the step (enqueued eagerly, or captured into a CUDA graph) ----
  const size_t NH = static_cast<size_t>(N * H);
  auto enqueue = [&]() {
  K3_CUDA_CHECK(cudaMemcpyAsync(staging_d.get(), staging_host, sbytes, cudaMemcpyHostToDevice, stream));
  K3_CUDA_CHECK(embed_rows(w.embed, H, dptr<const int32_t>(o_tokens), static_cast<int>(N), P, stream));
  const bool attn_res = c.attn_res_block_size > 0;
  int64_t nb = 0, kda_i = 0, mla_i = 0;
  auto mix = [&](const float* wres) -> const float* {
    if (!attn_res || nb == 0) return P;
    prof.begin("attn_res", stream);
    K3_CUDA_CHECK(attn_res_mix(dptr<const float* const>(o_src[static_cast<size_t>(nb)]), static_cast<int>(nb + 1), wres,
                               static_cast<int>(N), static_cast<int>(H), eps, h, stream));
    prof.end(stream);
    return h;
  };
  // xin = RMSNorm(layer input) * norm_w; the input is P, or with AttnRes the mix over the blocks, fused
  // with the norm into one kernel.
  auto mix_norm = [&](const float* wres, const float* norm_w) {
    prof.begin("norms+residual", stream);
    if (!attn_res || nb == 0)
      K3_CUDA_CHECK(rmsnorm(P, norm_w, static_cast<int>(N), static_cast<int>(H), static_cast<int>(H), eps, xin, stream));
    else
      K3_CUDA_CHECK(attn_res_mix_rmsnorm(dptr<const float* const>(o_src[static_cast<size_t>(nb)]), static_cast<int>(nb + 1),
                                         wres, static_cast<int>(N), static_cast<int>(H), eps, norm_w, xin, stream));
    prof.end(stream);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DLayer& L = w.layers[static_cast<size_t>(l)];
    mix_norm(L.attn_res, L.input_norm);  // before this layer may start a new block
    bool p_empty = false;
    if (attn_res && l % c.attn_res_block_size == 0) {
      K3_CUDA_CHECK(cudaMemcpyAsync(blocks + nb * N * H, P, NH * 4, cudaMemcpyDeviceToDevice, stream));
      ++nb;
      p_empty = true;
    }
    if (L.is_kda) {
      const DKda& K = L.kda;
      prof.begin("kda proj", stream);
      const int Hk = static_cast<int>(c.kda_heads), D = static_cast<int>(c.kda_head_dim), W = static_cast<int>(c.conv_kernel);
      linear(K.q, xin, N, pq);
      linear(K.k, xin, N, pk);
      linear(K.v, xin, N, pv);
      linear(K.f_a, xin, N, fa);
      linear(K.f_b, fa, N, g);
      linear(K.b, xin, N, beta);
      if (c.kda_full_rank_gate) {
        linear(K.g, xin, N, gate);
      } else {
        linear(K.g_a, xin, N, fa);
        linear(K.g_b, fa, N, gate);
      }
      prof.end(stream);
      prof.begin("kda core", stream);
      const bool bounded = c.gate_lower_bound.has_value();
      const float lb = bounded ? *c.gate_lower_bound : 0.f;
      const size_t li = static_cast<size_t>(kda_i++);
      if (all_decode) {
        K3_CUDA_CHECK(kda_decode_fused(dptr<const KdaSeq>(o_kall[li]), static_cast<int>(S), Hk, D, W, pq, pk, pv, K.q_conv,
                                       K.k_conv, K.v_conv, g, K.dt_bias, K.A_log, bounded, lb, beta, gate, K.o_norm, eps, o,
                                       stream));
      } else {
        K3_CUDA_CHECK(kda_conv_l2norm(dptr<const KdaSeq>(o_kall[li]), static_cast<int>(S), static_cast<int>(N), Hk, D, W, pq, pk,
                                      pv, K.q_conv, K.k_conv, K.v_conv, q, k, v, stream));
        K3_CUDA_CHECK(kda_gates(static_cast<int>(N), Hk, D, g, K.dt_bias, K.A_log, bounded, lb, beta, stream));
        if (n_rec > 0)
          K3_CUDA_CHECK(kda_recurrent(dptr<const KdaSeq>(o_krec[li]), n_rec, Hk, D, q, k, v, g, beta, o, stream));
        if (n_chk > 0)
          K3_CUDA_CHECK(kda_chunked(dptr<const KdaSeq>(o_kchk[li]), n_chk, static_cast<int>(N), Hk, D, kda_chunk, q, k, v, g,
                                    beta, o, kda_ws.get(), kda_ws.bytes(), stream));
        K3_CUDA_CHECK(kda_output_gate(static_cast<int>(N), Hk, D, o, K.o_norm, eps, gate, stream));
      }
      prof.end(stream);
      prof.begin("kda proj", stream);
      linear(K.o, o, N, tmp);
      prof.end(stream);
    } else {
      const DMla& M = L.mla;
      const int nh = static_cast<int>(c.mla_heads), dn = static_cast<int>(c.qk_nope_dim), dr = static_cast<int>(c.qk_rope_dim),
                dv = static_cast<int>(c.v_head_dim), kr = static_cast<int>(c.kv_lora_rank);
      const int qk = dn + dr, cd = kr + dr;
      prof.begin("mla proj", stream);
      if (!M.q_a.empty()) {
        linear(M.q_a, xin, N, qa);
        K3_CUDA_CHECK(rmsnorm(qa, M.q_a_norm, static_cast<int>(N), static_cast<int>(c.q_lora_rank), static_cast<int>(c.q_lora_rank),
                              c.mla_norm_eps, qa, stream));
        linear(M.q_b, qa, N, mq);
      } else {
        linear(M.q, xin, N, mq);
      }
      linear(M.kv_a, xin, N, lat);
      K3_CUDA_CHECK(rmsnorm(lat, M.kv_a_norm, static_cast<int>(N), kr, cd, c.mla_norm_eps, lat, stream));
      prof.end(stream);
      prof.begin("mla attn", stream);
      const MlaPaging pg = paging(mla_i++);
      K3_CUDA_CHECK(mla_write_rows(pg, static_cast<int>(N), lat, stream));
      if (n_dec_tok > 0) {
      // q_lat[t][h][0:kr] = W_UK_h^T q_nope[t][h] (column-major mapping: docs/kernels-cuda.md).
      const float one = 1.f, zero = 0.f;
      if (N <= kMlaSmallBatch)
        K3_CUDA_CHECK(mla_absorb_q(mq, M.kv_b, static_cast<int>(N), nh, dn, dr, dv, kr, ql, stream));
      else
        check_cublas(cublasSgemmStridedBatched(lin->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, kr, static_cast<int>(N), dn, &one,
                                               M.kv_b, kr, static_cast<long long>(dn + dv) * kr, mq, nh * qk, qk, &zero, ql,
                                               nh * cd, cd, nh),
                     "q absorption");
      K3_CUDA_CHECK(mla_copy_qpe(mq, static_cast<int>(N), nh, dn, dr, kr, ql, stream));
      MlaPaging pgd = pg;
      pgd.tok_index = n_dec_tok == N ? nullptr : dptr<const int32_t>(o_dectok);
      K3_CUDA_CHECK(mla_attend_latent(pgd, n_dec_tok, nh, kr, dr, ql, 1.0f / std::sqrt(static_cast<float>(qk)), ol, attn_ws,
                                      stream));
      // o[t][h] = W_UV_h o_lat[t][h]
      if (N <= kMlaSmallBatch)
        K3_CUDA_CHECK(mla_up_v(ol, M.kv_b, static_cast<int>(N), nh, dn, dv, kr, mo, stream));
      else
        check_cublas(cublasSgemmStridedBatched(lin->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, dv, static_cast<int>(N), kr, &one,
                                               M.kv_b + static_cast<int64_t>(dn) * kr, kr, static_cast<long long>(dn + dv) * kr,
                                               ol, nh * kr, kr, &zero, mo, nh * dv, dv, nh),
                     "v up-projection");
      }
      for (size_t si : prefill_seqs) mla_prefill_mha(M, pg, static_cast<int>(si), seqs[si].offset, seqs[si].n, seqs[si].past, mo);
      prof.end(stream);
      prof.begin("mla proj", stream);
      if (!M.g.empty()) {
        linear(M.g, xin, N, mg);
        K3_CUDA_CHECK(sigmoid_mul(mo, mg, N * nh * dv, stream));
      }
      linear(M.o, mo, N, tmp);
      prof.end(stream);
    }
    prof.begin("norms+residual", stream);
    if (p_empty)
      K3_CUDA_CHECK(cudaMemcpyAsync(P, tmp, NH * 4, cudaMemcpyDeviceToDevice, stream));
    else
      K3_CUDA_CHECK(add_inplace(P, tmp, static_cast<int64_t>(NH), stream));
    prof.end(stream);
    mix_norm(L.mlp_res, L.post_attn_norm);
    if (L.is_moe) {
      const DMoe& M = L.moe;
      const int E = static_cast<int>(c.num_experts), K = static_cast<int>(c.top_k);
      const int X = static_cast<int>(c.expert_in_dim());
      prof.begin("moe route", stream);
      linear(M.router, xin, N, rl);
      K3_CUDA_CHECK(moe_route(static_cast<int>(N), E, K, rl, M.bias, c.moe_renormalize, c.routed_scaling_factor, idx, wts, stream));
      prof.end(stream);
      prof.begin("moe latent", stream);
      const float* ex = xin;
      if (!M.latent_down.empty()) {
        linear(M.latent_down, xin, N, z);
        ex = z;
      }
      prof.end(stream);
      prof.begin("moe experts", stream);
      K3_CUDA_CHECK(moe_experts(M.experts, static_cast<int>(N), K, ex, idx, wts,
                                c.act == Activation::SiTU ? GluAct::SiTU : GluAct::SiLU, c.situ_beta, c.situ_linear_beta, acc,
                                *moe_ws, stream, gemm_bf16 ? MoePrecision::Bf16 : MoePrecision::Bf16x2));
      prof.end(stream);
      prof.begin("moe latent", stream);
      if (!M.latent_up.empty()) {
        if (M.latent_norm)
          K3_CUDA_CHECK(rmsnorm(acc, M.latent_norm, static_cast<int>(N), X, X, eps, acc, stream));
        linear(M.latent_up, acc, N, tmp);
      } else {
        K3_CUDA_CHECK(cudaMemcpyAsync(tmp, acc, NH * 4, cudaMemcpyDeviceToDevice, stream));
      }
      prof.end(stream);
      if (!M.shared.gate.empty()) {
        prof.begin("shared/dense ffn", stream);
        glu_mlp(M.shared, xin, N, sh);
        K3_CUDA_CHECK(add_inplace(tmp, sh, static_cast<int64_t>(NH), stream));
        prof.end(stream);
      }
    } else {
      prof.begin("shared/dense ffn", stream);
      glu_mlp(L.mlp, xin, N, tmp);
      prof.end(stream);
    }
    K3_CUDA_CHECK(add_inplace(P, tmp, static_cast<int64_t>(NH), stream));
  }
  const float* hout = mix(w.out_res);

  // ---- logits ----
  if (R > 0) {
    prof.begin("lm_head", stream);
    K3_CUDA_CHECK(gather_rows(hout, dptr<const int32_t>(o_rows), static_cast<int>(R), static_cast<int>(H), hs, stream));
    K3_CUDA_CHECK(rmsnorm(hs, w.final_norm, static_cast<int>(R), static_cast<int>(H), static_cast<int>(H), eps, hs, stream));
    linear(w.lm_head, hs, R, logits_d.get<float>());
    prof.end(stream);
  }
  };  // enqueue

  // Decode steps of a batch size seen before run as one CUDA graph launch.
  const bool graphable = use_graphs && !prof.on() && all_decode && N == S && R == S;
  const std::pair<int64_t, int64_t> key{S, stride};
  if (graphable && graphs.graphs.count(key) && graphs.graphs[key].generation == graphs.generation) {
    K3_CUDA_CHECK(cudaGraphLaunch(graphs.graphs[key].exec, stream));
  } else if (graphable && graphs.seen.count(key)) {
    if (graphs.graphs.count(key)) {  // stale: a buffer it refers to was reallocated
      cudaGraphExecDestroy(graphs.graphs[key].exec);
      graphs.graphs.erase(key);
    }
    cudaGraph_t g = nullptr;
    K3_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue();
    } catch (...) {
      cudaStreamEndCapture(stream, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    K3_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    K3_CUDA_CHECK(e);
    graphs.graphs[key] = {exec, graphs.generation};
    K3_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  } else {
    if (graphable) graphs.seen.insert(key);
    enqueue();
  }
  tail(R);
  K3_CUDA_CHECK(cudaStreamSynchronize(stream));
  prof.collect();
  done(R);
  for (const Seq& s : seqs) s.cache->advance(s.n);
}

}  // namespace k3::cuda
