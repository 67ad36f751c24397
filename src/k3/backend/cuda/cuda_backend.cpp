// CudaBackend: the step's staging and sizing, scratch, dense ops and the Attention-Residual mix (the KDA,
// MLA and MoE ops are in cuda_backend_{kda,mla,moe}.cpp).
#include "k3/backend/cuda/cuda_backend.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include <algorithm>
#include <array>
#include <string>

#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/drafter_kernels.h"
#include "k3/backend/cuda/kda_chunked_tc.h"
#include "k3/backend/cuda/kda_kernels.h"
#include "k3/backend/cuda/linear_skinny.h"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_tables.h"
#include "k3/core/error.h"

namespace k3::cuda {

using graph::Tensor;

// Streaming a layer's host experts costs their bytes over PCIe whatever the batch; computing them on the
// CPU costs per (token, expert) pair. So the switch point is a number of pairs per expert, scaled by the
// bytes an expert parameter takes: measured on the H200 host (16 cores, PCIe; docs/perf/hybrid.md) with
// MXFP4 experts, E 64, top-8: the CPU won at 32 tokens (4 pairs per expert), streaming at 128 (16), the
// linear interpolation crosses at ~46 tokens = 6 pairs per expert. BF16 experts carry 3.8x the bytes.
int64_t CudaBackend::default_moe_stream_min_tokens(const ModelConfig& c) {
  if (c.num_experts <= 0 || c.top_k <= 0) return 0;
  constexpr double kPairsPerExpertMxfp4 = 6.0;
  const double bytes_ratio = c.expert_quant_format ? 1.0 : 2.0 / (4.25 / 8);
  return static_cast<int64_t>(std::ceil(kPairsPerExpertMxfp4 * bytes_ratio * static_cast<double>(c.num_experts) /
                                        static_cast<double>(c.top_k)));
}

CudaBackend::CudaBackend(const ModelConfig& c, const CacheSpec& spec, cudaStream_t stream, bool gemm_bf16, Profiler& prof)
    : cfg_(c),
      spec_(spec),
      stream_(stream),
      gemm_bf16_(gemm_bf16),
      kda_tc_(gemm_bf16 && c.kda_head_dim == 128),
      kda_tc_any_decay_(!(c.gate_lower_bound && *c.gate_lower_bound >= -5.5f)),
      prof_(prof) {
  lin_ = std::make_unique<LinearRunner>(stream, gemm_bf16 ? GemmPrecision::Bf16 : GemmPrecision::Bf16x2);
  const char* overlap = std::getenv("K3_HYBRID_OVERLAP");
  overlap_host_moe_ = !(overlap && std::string(overlap) == "0");
  moe_stream_min_tokens_ = default_moe_stream_min_tokens(c);
  if (const char* m = std::getenv("K3_MOE_STREAM_MIN_TOKENS")) moe_stream_min_tokens_ = std::max(0L, std::atol(m));
}

CudaBackend::~CudaBackend() = default;

Tensor CudaBackend::logits() const {
  return Tensor::f32(logits_d_.get<float>(), n_logits_, cfg_.vocab_size);
}

Tensor CudaBackend::taps() const { return Tensor::f32(taps_d_.get<float>(), n_taps_ * n_logits_, cfg_.hidden_size); }

MlaPaging CudaBackend::paging(int64_t layer) const {
  return MlaPaging{staged<uint8_t* const>(sd_.pages), staged<const int32_t>(sd_.page_start),
                   staged<const int32_t>(sd_.page_tokens), staged<const int64_t>(sd_.layer_stride),
                   staged<const int32_t>(sd_.tok_seq), staged<const int32_t>(sd_.tok_pos), static_cast<int>(layer),
                   static_cast<int>(spec_.mla_rank), static_cast<int>(spec_.mla_rope), spec_.mla_dtype};
}

// The MLA page table of the step: one pointer per page, shared by every layer (a page holds all MLA
// layers; each sequence's layer stride says where a layer's rows start in it). Each sequence's pages
// start at a multiple of the page stride (the largest page count rounded up to a power of two), so decode
// steps of one batch size keep one staging layout (CUDA graphs).
void CudaBackend::stage_mla(const graph::StepPlan& plan) {
  const int64_t S = static_cast<int64_t>(plan.seqs.size());
  std::vector<int32_t> page_start(static_cast<size_t>(S)), page_tokens(static_cast<size_t>(S));
  std::vector<int64_t> layer_stride(static_cast<size_t>(S));
  std::vector<MlaPageTable> tables;
  int64_t stride = 4;
  const bool has_mla = cfg_.num_mla_layers() > 0;
  for (const graph::StepSeq& s : plan.seqs) {
    tables.push_back(s.cache->mla_pages());
    const int64_t B = tables.back().page_tokens;
    if (!has_mla) continue;
    while (stride < (s.past + s.n + B - 1) / B) stride *= 2;
  }
  std::vector<uint8_t*> ptrs(static_cast<size_t>(S * stride), nullptr);
  for (int64_t i = 0; i < S; ++i) {
    const graph::StepSeq& s = plan.seqs[static_cast<size_t>(i)];
    const MlaPageTable& t = tables[static_cast<size_t>(i)];
    page_start[static_cast<size_t>(i)] = static_cast<int32_t>(i * stride);
    page_tokens[static_cast<size_t>(i)] = static_cast<int32_t>(std::min<int64_t>(t.page_tokens, int64_t{1} << 30));
    layer_stride[static_cast<size_t>(i)] = t.layer_stride;
    // A model without MLA layers (K3 cut to its first 1-3 layers, all KDA) has no latent pages: the caches
    // reserve none, and their tables are empty.
    const int64_t np = has_mla ? (s.past + s.n + t.page_tokens - 1) / t.page_tokens : 0;
    if (np > static_cast<int64_t>(t.pages.size()))
      throw Error("internal error: a sequence's latent cache holds fewer pages than its tokens need");
    for (int64_t j = 0; j < np; ++j) ptrs[static_cast<size_t>(i * stride + j)] = t.pages[static_cast<size_t>(j)];
  }
  sd_.pages = st_.put(ptrs);
  sd_.layer_stride = st_.put(layer_stride);
  sd_.page_start = st_.put(page_start);
  sd_.page_tokens = st_.put(page_tokens);
  page_stride_ = stride;
  // Tokens of decode-form sequences (absorbed MLA); prefill-form sequences take the MHA form.
  std::vector<int32_t> dec_tokens;
  for (const graph::StepSeq& s : plan.seqs)
    if (!s.prefill_form)
      for (int64_t t = 0; t < s.n; ++t) dec_tokens.push_back(static_cast<int32_t>(s.offset + t));
  sd_.dec_tokens = st_.put(dec_tokens);
  sd_.n_dec_tokens = static_cast<int>(dec_tokens.size());
}

// KDA descriptors per layer: all sequences, then the split into recurrent / chunked sets.
void CudaBackend::stage_kda(const graph::StepPlan& plan) {
  const int64_t n_kda = cfg_.num_kda_layers();
  sd_.kda_chunk = plan.kda_chunk > 0 ? plan.kda_chunk : kda_tc_ ? kDefaultKdaTcChunk : kDefaultKdaChunk;
  sd_.kda_tc = kda_tc_ && (!kda_tc_any_decay_ || sd_.kda_chunk == 32);
  // (No bf16-state chunked kernel yet: a bf16 state takes the recurrence for prefill too.)
  const bool chunk_ok = (sd_.kda_chunk == 16 || sd_.kda_chunk == 32 || sd_.kda_chunk == 64) &&
                        spec_.kda_state_dtype == CacheDType::F32;
  sd_.kda_all.assign(static_cast<size_t>(n_kda), 0);
  sd_.kda_rec.assign(static_cast<size_t>(n_kda), 0);
  sd_.kda_chk.assign(static_cast<size_t>(n_kda), 0);
  for (int64_t li = 0; li < n_kda; ++li) {
    std::vector<KdaSeq> all, rec, chk;
    for (const graph::StepSeq& s : plan.seqs) {
      const KdaStateView v = s.cache->kda_state(li);
      const KdaSeq d{static_cast<float*>(v.S), v.conv_q, v.conv_k, v.conv_v, static_cast<int32_t>(s.offset), static_cast<int32_t>(s.n)};
      all.push_back(d);
      (s.prefill_form && chunk_ok ? chk : rec).push_back(d);
    }
    sd_.n_rec = static_cast<int>(rec.size());
    sd_.n_chk = static_cast<int>(chk.size());
    sd_.kda_all[static_cast<size_t>(li)] = st_.put(all);
    sd_.kda_rec[static_cast<size_t>(li)] = st_.put(rec);
    sd_.kda_chk[static_cast<size_t>(li)] = st_.put(chk);
  }
  sd_.kda_rounds.clear();
  sd_.kda_verify.clear();
  sd_.kda_snaps.clear();
  if (plan.any_snapshot() && !stage_kda_verify(plan)) stage_kda_rounds(plan);
}

// Scratch and workspaces for N tokens, rounded up (multiples of 64, at least doubling) so that a growing
// batch re-sizes (and drops captured graphs) only a few times.
void CudaBackend::size_workspaces(int64_t N, int64_t R, int64_t T) {
  const ModelConfig& c = cfg_;
  if (N > token_cap_) {
    token_cap_ = std::max<int64_t>((N + 63) / 64 * 64, token_cap_ * 2);
    const int n = static_cast<int>(token_cap_);
    if (c.kda_heads > 0) {
      size_t kb = 0;
      const int H = static_cast<int>(c.kda_heads), D = static_cast<int>(c.kda_head_dim);
      for (int ch : {16, 32, 64})
        kb = std::max({kb, kda_chunked_workspace_bytes(n, n, H, D, ch),
                       kda_tc_ ? kda_chunked_tc_workspace_bytes(n, n, H, D, ch == 64 ? 64 : 32) : size_t{0}});
      kda_ws_ = DeviceBuffer();
      kda_ws_ = DeviceBuffer(kb);
    }
    if (c.num_experts > 0) {
      moe_ws_.reset();
      moe_ws_ = std::make_unique<MoeWorkspace>(n, static_cast<int>(c.top_k), moe_E_ >= 0 ? moe_E_ : static_cast<int>(c.num_experts),
                                               moe_I_ >= 0 ? moe_I_ : static_cast<int>(c.moe_intermediate_size),
                                               static_cast<int>(c.expert_in_dim()));
    }
    if (c.num_mla_layers() > 0) {
      // the split-key partials of the absorbed attention, at the most demanding batch size
      const size_t wf = mla_attend_workspace_floats_max(n, static_cast<int>(c.mla_heads), static_cast<int>(c.kv_lora_rank));
      mla_ws_ = DeviceBuffer();
      mla_ws_ = DeviceBuffer(std::max<size_t>(wf, 1) * 4);
    }
    ++generation_;
  }
  if (bytes_per_token_ > 0) scratch_.reserve(bytes_per_token_ * static_cast<size_t>(token_cap_));
  else scratch_.reserve(0);
  const size_t lbytes = static_cast<size_t>((R + 63) / 64 * 64 * c.vocab_size) * 4;
  if (logits_d_.bytes() < lbytes) {
    logits_d_ = DeviceBuffer(lbytes);
    ++generation_;
  }
  const size_t tbytes = static_cast<size_t>((R + 63) / 64 * 64 * T * c.hidden_size) * 4;
  if (taps_d_.bytes() < tbytes) {
    taps_d_ = DeviceBuffer(tbytes);
    ++generation_;
  }
}

void CudaBackend::prepare(const graph::StepPlan& plan) {
  const int64_t N = plan.n_tokens();
  st_.clear();
  std::vector<int32_t> tok_seq, tok_pos;
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    for (int64_t t = 0; t < plan.seqs[i].n; ++t) {
      tok_seq.push_back(static_cast<int32_t>(i));
      tok_pos.push_back(static_cast<int32_t>(plan.seqs[i].past + t));
    }
  sd_.tokens = st_.put(plan.tokens);
  sd_.tok_seq = st_.put(tok_seq);
  sd_.tok_pos = st_.put(tok_pos);
  sd_.logit_rows = st_.put(plan.logit_rows);
  stage_mla(plan);
  stage_kda(plan);
  staging_bytes_ = st_.bytes().size();
  if (staging_d_.bytes() < staging_bytes_) {
    staging_d_ = DeviceBuffer(std::max(staging_bytes_, staging_d_.bytes() * 2));
    ++generation_;
  }
  void* const before = staging_h_.ensure(0);
  void* const host = staging_h_.ensure(staging_bytes_);
  if (host != before) ++generation_;
  std::memcpy(host, st_.bytes().data(), staging_bytes_);
  n_seqs_ = static_cast<int64_t>(plan.seqs.size());
  // The graph key: (sequences, page stride), then, whenever a step is not one row per sequence, (rows,
  // snapshot_after, n_snapshots, prefill form) per sequence and the tap ids (a step that saves taps runs
  // more ops); the exact values, so that no two shapes share a graph. Built once per step here.
  graph_key_.assign({n_seqs_, page_stride_});
  if (N != n_seqs_ || plan.any_snapshot() || !plan.tap_layers.empty()) {
    for (const graph::StepSeq& q : plan.seqs)
      graph_key_.insert(graph_key_.end(), {q.n, q.snapshot_after, q.n_snapshots, static_cast<int64_t>(q.prefill_form)});
    graph_key_.push_back(-1);  // taps after the sequences
    graph_key_.insert(graph_key_.end(), plan.tap_layers.begin(), plan.tap_layers.end());
  }
  n_tokens_ = N;
  n_logits_ = plan.n_logits();
  n_taps_ = static_cast<int64_t>(plan.tap_layers.size());
  size_workspaces(N, n_logits_, n_taps_);
}

void CudaBackend::begin_step(const graph::StepPlan& plan) {
  plan_ = &plan;
  K3_CUDA_CHECK(cudaMemcpyAsync(staging_d_.get(), staging_h_.ensure(0), staging_bytes_, cudaMemcpyHostToDevice, stream_));
}

Tensor CudaBackend::scratch(int64_t rows, int64_t cols, graph::ElemType type) {
  void* p = scratch_.take(static_cast<size_t>(std::max<int64_t>(rows * cols, 1)) * 4);
  // Learn the scratch a token needs (everything the graph takes is per token), for the next prepare().
  const size_t n = static_cast<size_t>(std::max<int64_t>(n_tokens_, 1));
  bytes_per_token_ = std::max(bytes_per_token_, (scratch_.step_peak() + n - 1) / n);
  return Tensor{p, rows, cols, cols, type};
}

void CudaBackend::embed(const WeightMatrix& table, Tensor out) {
  if (table.device == kHostDevice) return host_embed(table, out);
  if (is_gguf_block(table.format)) {  // a quantised token table (GGUF): its rows decoded exactly, as the CPU's dequant_row
    K3_CUDA_CHECK(cuda::quant_dequant_rows(table, 0, staged<const int32_t>(sd_.tokens), out.rows, out.f(), out.stride, stream_));
    return;
  }
  if (table.format != WeightFormat::BF16) throw Error("CUDA backend: the embedding table must be bf16 or a GGUF block format");
  K3_CUDA_CHECK(cuda::embed_rows(static_cast<const uint16_t*>(table.data), table.cols, staged<const int32_t>(sd_.tokens),
                           static_cast<int>(out.rows), out.f(), stream_));
}

void CudaBackend::linear(const WeightMatrix& W, Tensor x, Tensor y) {
  if (W.device == kHostDevice) return host_linear(W, x, y);
  prof_.begin("linear", stream_);
  lin_->run(W, x.f(), x.rows, y.f());
  prof_.end(stream_);
}

void CudaBackend::linear_group(Tensor x, std::span<const graph::Projection> ps) {
  // Host weights (hybrid placement) and strided views go one by one; the rest in one launch where they can.
  std::array<const WeightMatrix*, kLinearGroupMax> W{};
  std::array<float*, kLinearGroupMax> y{};
  bool device = ps.size() <= W.size() && x.contiguous();
  for (size_t m = 0; device && m < ps.size(); ++m) {
    device = ps[m].W->device != kHostDevice && ps[m].y.contiguous();
    W[m] = ps[m].W;
    y[m] = ps[m].y.f();
  }
  if (!device) return graph::Backend::linear_group(x, ps);
  prof_.begin("linear", stream_);
  lin_->run_group(W.data(), y.data(), static_cast<int>(ps.size()), x.f(), x.rows);
  prof_.end(stream_);
}

void CudaBackend::rmsnorm(Tensor x, const float* w, int64_t dim, float eps, Tensor y) {
  if (x.stride != y.stride) throw Error("CUDA backend: rmsnorm layouts differ");
  prof_.begin("norms+residual", stream_);
  K3_CUDA_CHECK(cuda::rmsnorm(x.f(), w, static_cast<int>(x.rows), static_cast<int>(dim), static_cast<int>(x.stride), eps, y.f(),
                              stream_));
  prof_.end(stream_);
}

void CudaBackend::glu(Tensor gate, Tensor up, const graph::GluParams& p) {
  K3_CUDA_CHECK(cuda::glu(gate.f(), up.f(), gate.count(), p.situ, p.beta, p.linear_beta, stream_));
}

void CudaBackend::add(Tensor y, Tensor x) {
  prof_.begin("norms+residual", stream_);
  K3_CUDA_CHECK(add_inplace(y.f(), x.f(), y.count(), stream_));
  prof_.end(stream_);
}

void CudaBackend::add_rmsnorm(Tensor y, Tensor x, const float* w, float eps, Tensor out) {
  if (x.stride != y.stride || out.stride != y.stride || x.rows != y.rows || x.cols != y.cols)
    throw Error("CUDA backend: add_rmsnorm layouts differ");
  prof_.begin("norms+residual", stream_);
  K3_CUDA_CHECK(cuda::add_rmsnorm(y.f(), x.f(), w, static_cast<int>(y.rows), static_cast<int>(y.cols),
                                  static_cast<int>(y.stride), eps, out.f(), stream_));
  prof_.end(stream_);
}

void CudaBackend::copy(Tensor dst, Tensor src) {
  if (dst.rows != src.rows || dst.cols != src.cols) throw Error("CUDA backend: copy shapes differ");
  if (dst.contiguous() && src.contiguous()) {
    K3_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.count()) * 4, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  K3_CUDA_CHECK(copy_rows(dst.f(), dst.stride, src.f(), src.stride, dst.rows, dst.cols, stream_));  // strided / broadcast
}

void CudaBackend::block_attention(Tensor q, Tensor k, Tensor v, int64_t block, int64_t heads, int64_t head_dim,
                                  float scale, Tensor o) {
  for (const Tensor* t : {&q, &k, &v, &o})
    if (!t->contiguous() || t->rows != q.rows || t->cols != heads * head_dim)
      throw Error("CUDA backend: block_attention needs contiguous [n][heads * head_dim] tensors");
  if (block < 1 || q.rows % block != 0 || 2 * block * head_dim + block * block > 12 * 1024)
    throw Error("CUDA backend: block_attention over " + std::to_string(q.rows) + " rows in blocks of " +
                std::to_string(block) + " (head_dim " + std::to_string(head_dim) + ") is not supported");
  K3_CUDA_CHECK(cuda::block_attention(q.f(), k.f(), v.f(), q.rows, static_cast<int>(block), static_cast<int>(heads),
                                      static_cast<int>(head_dim), scale, o.f(), stream_));
}

void CudaBackend::sigmoid_mul(Tensor y, Tensor g) { K3_CUDA_CHECK(cuda::sigmoid_mul(y.f(), g.f(), y.count(), stream_)); }

void CudaBackend::gather_logit_rows(Tensor h, Tensor out) {
  K3_CUDA_CHECK(gather_rows(h.f(), staged<const int32_t>(sd_.logit_rows), static_cast<int>(out.rows), static_cast<int>(h.cols),
                            out.f(), stream_));
}

void CudaBackend::attn_res_mix(Tensor blocks, int64_t nb, Tensor partial, const float* w, float eps, Tensor out) {
  prof_.begin("attn_res", stream_);
  K3_CUDA_CHECK(cuda::attn_res_mix(blocks.f(), partial.count(), static_cast<int>(nb), partial.f(), w, static_cast<int>(partial.rows),
                                   static_cast<int>(partial.cols), eps, out.f(), stream_));
  prof_.end(stream_);
}

void CudaBackend::attn_res_mix_rmsnorm(Tensor blocks, int64_t nb, Tensor partial, const float* w, float eps,
                                       const float* norm_w, Tensor out) {
  prof_.begin("norms+residual", stream_);
  K3_CUDA_CHECK(cuda::attn_res_mix_rmsnorm(blocks.f(), partial.count(), static_cast<int>(nb), partial.f(), w,
                                           static_cast<int>(partial.rows), static_cast<int>(partial.cols), eps, norm_w, out.f(),
                                           stream_));
  prof_.end(stream_);
}

}  // namespace k3::cuda
