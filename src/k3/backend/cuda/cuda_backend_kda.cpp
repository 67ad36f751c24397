// CudaBackend's KDA ops (model-spec 3.2) over kda_kernels.h; a decode step takes the fused kernel.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/kda_chunked_tc.h"
#include "k3/backend/cuda/kda_kernels.h"

namespace k3::cuda {

using graph::Tensor;

// Speculative verification: a sequence with snapshots after rows a, a+1, .., a+m-1 runs in m+1 pieces,
// [0, a), [a, a+1), .., [a+m-1, n), piece r in round r; after round r < m its conv tails and state are
// copied into snapshot slot r. Both ops are exact in any split (the conv's tail carries the past; the
// decode-form recurrence goes token by token), so the snapshots are the states of the decode steps that
// speculation off would have run, and the final state is the unsplit one. Sequences without snapshots
// run whole in round 0 (prefill-form ones through the chunked kernels as usual).
void CudaBackend::stage_kda_rounds(const graph::StepPlan& plan) {
  int64_t rounds = 1;
  for (const graph::StepSeq& s : plan.seqs) rounds = std::max(rounds, s.n_snapshots + 1);
  const size_t state_b = static_cast<size_t>(spec_.kda_state_bytes());
  const size_t conv_b = static_cast<size_t>(spec_.kda_conv_floats) * sizeof(float);
  for (int64_t li = 0; li < cfg_.num_kda_layers(); ++li) {
    std::vector<KdaRound> layer(static_cast<size_t>(rounds));
    for (int64_t r = 0; r < rounds; ++r) {
      std::vector<KdaSeq> conv, rec;
      std::vector<CopySeg> conv_copies, state_copies;
      KdaRound& round = layer[static_cast<size_t>(r)];
      for (const graph::StepSeq& s : plan.seqs) {
        const int64_t m = s.n_snapshots;
        if (r > m) continue;
        const int64_t from = r == 0 ? 0 : s.snapshot_after + r - 1;
        const int64_t to = m == 0 ? s.n : r < m ? s.snapshot_after + r : s.n;
        const KdaStateView v = s.cache->kda_state(li);
        const KdaSeq piece{static_cast<float*>(v.S), v.conv_q, v.conv_k, v.conv_v, static_cast<int32_t>(s.offset + from),
                           static_cast<int32_t>(to - from)};
        conv.push_back(piece);
        if (!s.prefill_form) rec.push_back(piece);
        if (r < m) {
          const KdaStateView snap = s.cache->kda_snapshot(li, r);
          state_copies.push_back({snap.S, v.S, state_b});
          conv_copies.push_back({snap.conv_q, v.conv_q, conv_b});
          conv_copies.push_back({snap.conv_k, v.conv_k, conv_b});
          conv_copies.push_back({snap.conv_v, v.conv_v, conv_b});
        }
      }
      round.conv = st_.put(conv);
      round.rec = st_.put(rec);
      round.n_conv = static_cast<int>(conv.size());
      round.n_rec = static_cast<int>(rec.size());
      round.conv_copies = st_.put(conv_copies);
      round.state_copies = st_.put(state_copies);
      round.n_conv_copies = static_cast<int>(conv_copies.size());
      round.n_state_copies = static_cast<int>(state_copies.size());
    }
    sd_.kda_rounds.push_back(std::move(layer));
  }
}

// The fused alternative to the rounds above (kda_verify_fused: the decode kernel's arithmetic token by
// token, snapshots written from registers): one launch per layer instead of ~5 per round, and the same
// bits as the decode steps speculation off runs. Taken when no sequence of the step is prefill-form (those
// need the chunked kernels) and the shapes are the fused kernel's; K3_KDA_FUSED_VERIFY=0 keeps the rounds
// (A/B measurement).
bool CudaBackend::stage_kda_verify(const graph::StepPlan& plan) {
  static const bool enabled = [] {
    const char* e = std::getenv("K3_KDA_FUSED_VERIFY");
    return !(e && std::string(e) == "0");
  }();
  const int64_t D = cfg_.kda_head_dim, W = cfg_.conv_kernel;
  if (!enabled || !(D == 32 || D == 64 || D == 128) || W < 1 || W > 4) return false;
  for (const graph::StepSeq& s : plan.seqs)
    if (s.prefill_form) return false;
  for (int64_t li = 0; li < cfg_.num_kda_layers(); ++li) {
    std::vector<KdaSnapSeq> seqs;
    std::vector<KdaSeq> snaps;
    for (const graph::StepSeq& s : plan.seqs) {
      const KdaStateView v = s.cache->kda_state(li);
      const int32_t m = static_cast<int32_t>(s.n_snapshots > 0 && s.snapshot_after > 0 ? s.n_snapshots : 0);
      seqs.push_back({KdaSeq{static_cast<float*>(v.S), v.conv_q, v.conv_k, v.conv_v, static_cast<int32_t>(s.offset),
                             static_cast<int32_t>(s.n)},
                      m > 0 ? static_cast<int32_t>(s.snapshot_after) : 1, m, static_cast<int32_t>(snaps.size())});
      for (int32_t r = 0; r < m; ++r) {
        const KdaStateView snap = s.cache->kda_snapshot(li, r);
        snaps.push_back(KdaSeq{static_cast<float*>(snap.S), snap.conv_q, snap.conv_k, snap.conv_v, 0, 0});
      }
    }
    sd_.kda_verify.push_back(st_.put(seqs));
    sd_.kda_snaps.push_back(st_.put(snaps));
  }
  return true;
}

// Through a staged table, not cudaMemcpyAsync: verification steps replay captured graphs too.
void CudaBackend::run_copies(size_t staged_segs, int n) {
  K3_CUDA_CHECK(copy_segments(staged<const CopySeg>(staged_segs), n, stream_));
}

void CudaBackend::kda_conv_l2norm(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, Tensor pq, Tensor pk,
                                  Tensor pv, Tensor q, Tensor k, Tensor v) {
  const ProfRegion region(prof_, "kda/conv", stream_);
  auto conv = [&](const KdaSeq* seqs, int n) {
    K3_CUDA_CHECK(cuda::kda_conv_l2norm(seqs, n, static_cast<int>(pq.rows), static_cast<int>(d.heads), static_cast<int>(d.head_dim),
                                        static_cast<int>(d.conv), pq.f(), pk.f(), pv.f(), w.q_conv.data(), w.k_conv.data(),
                                        w.v_conv.data(), q.f(), k.f(), v.f(), stream_));
  };
  if (sd_.kda_rounds.empty()) return conv(staged<const KdaSeq>(sd_.kda_all[static_cast<size_t>(layer)]), static_cast<int>(n_seqs_));
  for (const KdaRound& r : sd_.kda_rounds[static_cast<size_t>(layer)]) {
    conv(staged<const KdaSeq>(r.conv), r.n_conv);
    run_copies(r.conv_copies, r.n_conv_copies);
  }
}

void CudaBackend::kda_gates(const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate, Tensor g,
                            Tensor beta) {
  const ProfRegion region(prof_, "kda/gates", stream_);
  K3_CUDA_CHECK(cuda::kda_gates(static_cast<int>(g.rows), static_cast<int>(d.heads), static_cast<int>(d.head_dim), g.f(),
                                w.dt_bias.data(), w.A_log.data(), gate.bounded, gate.lower_bound, beta.f(), stream_));
}

void CudaBackend::kda_recurrence(int64_t layer, const graph::KdaDims& d, Tensor q, Tensor k, Tensor v, Tensor g,
                                 Tensor beta, Tensor o) {
  const ProfRegion region(prof_, "kda/chunk", stream_);
  const size_t li = static_cast<size_t>(layer);
  const int Hk = static_cast<int>(d.heads), D = static_cast<int>(d.head_dim);
  if (!sd_.kda_rounds.empty()) {  // speculative verification: the decode-form pieces round by round
    for (const KdaRound& r : sd_.kda_rounds[li]) {
      if (r.n_rec > 0)
        K3_CUDA_CHECK(cuda::kda_recurrent_typed(staged<const KdaSeq>(r.rec), r.n_rec, Hk, D, q.f(), k.f(), v.f(), g.f(),
                                                beta.f(), o.f(), spec_.kda_state_dtype, stream_));
      run_copies(r.state_copies, r.n_state_copies);
    }
  } else if (sd_.n_rec > 0) {
    K3_CUDA_CHECK(cuda::kda_recurrent_typed(staged<const KdaSeq>(sd_.kda_rec[li]), sd_.n_rec, Hk, D, q.f(), k.f(), v.f(),
                                            g.f(), beta.f(), o.f(), spec_.kda_state_dtype, stream_));
  }
  if (sd_.n_chk > 0 && sd_.kda_tc)  // bf16 GEMM mode: tensor cores (chunk 32 or 64)
    K3_CUDA_CHECK(cuda::kda_chunked_tc(staged<const KdaSeq>(sd_.kda_chk[li]), sd_.n_chk, static_cast<int>(q.rows), Hk, D,
                                       sd_.kda_chunk == 64 ? 64 : 32, KdaInType::F32, q.f(), k.f(), v.f(), g.f(), beta.f(),
                                       o.f(), nullptr, KdaTcTuning{}, kda_ws_.get(), kda_ws_.bytes(), stream_,
                                       kda_tc_any_decay_ ? KdaDecays::Any : KdaDecays::Bounded));
  else if (sd_.n_chk > 0)
    K3_CUDA_CHECK(cuda::kda_chunked(staged<const KdaSeq>(sd_.kda_chk[li]), sd_.n_chk, static_cast<int>(q.rows), Hk, D,
                                    sd_.kda_chunk, q.f(), k.f(), v.f(), g.f(), beta.f(), o.f(), kda_ws_.get(),
                                    kda_ws_.bytes(), stream_));
}

void CudaBackend::kda_output_gate(const KdaWeights& w, const graph::KdaDims& d, float eps, Tensor o, Tensor gate) {
  const ProfRegion region(prof_, "kda/out gate", stream_);
  K3_CUDA_CHECK(cuda::kda_output_gate(static_cast<int>(o.rows), static_cast<int>(d.heads), static_cast<int>(d.head_dim), o.f(),
                                      w.o_norm.data(), eps, gate.f(), stream_));
}

// The prefill under --gemm-precision bf16, when every sequence of the step takes the chunk kernels (no decode-form
// sequence needing fp32 q / k / v / g, no verification rounds): the conv writes q, k, v as bf16 bits and the gates
// a bf16 copy of the decays, so kda_chunked_tc reads half the bytes and takes its bf16-input kernels (the persistent
// intra kernel, the fused one where sequences x heads are many). q, k, v are the bits the chunk kernels made of fp32
// inputs before; the decays are now rounded to bf16 before their cumulative sums (FLA's chunk_kda takes bf16 too).
// K3_KDA_PREFILL_IN=f32 keeps the fp32 planes (the A/B).
bool CudaBackend::kda_bf16_prefill_ok() const {
  static const bool f32_forced = [] {
    const char* e = std::getenv("K3_KDA_PREFILL_IN");
    return e != nullptr && std::string(e) == "f32";
  }();
  return sd_.kda_tc && !f32_forced && sd_.n_chk > 0 && sd_.n_rec == 0 && sd_.kda_rounds.empty();
}

void CudaBackend::kda_prefill_bf16(int64_t layer, const KdaWeights& w, const graph::KdaDims& d,
                                   const graph::KdaGate& gate, float eps, Tensor pq, Tensor pk, Tensor pv, Tensor graw,
                                   Tensor braw, Tensor gate_proj, Tensor o) {
  graph::ScratchScope scope(*this);
  const int64_t N = pq.rows, C = d.channels();
  const int H = static_cast<int>(d.heads), D = static_cast<int>(d.head_dim);
  // scratch counts 4-byte elements: [N][C / 2] of them hold [N][C] bf16 (C = H x 128 is even)
  auto plane = [&] { return static_cast<uint16_t*>(scratch(N, (C + 1) / 2, graph::ElemType::F32).data); };
  uint16_t *q = plane(), *k = plane(), *v = plane(), *g = plane();
  const size_t li = static_cast<size_t>(layer);
  {
    const ProfRegion region(prof_, "kda/conv", stream_);
    K3_CUDA_CHECK(cuda::kda_conv_l2norm_bf16(staged<const KdaSeq>(sd_.kda_all[li]), static_cast<int>(n_seqs_),
                                             static_cast<int>(N), H, D, static_cast<int>(d.conv), pq.f(), pk.f(), pv.f(),
                                             w.q_conv.data(), w.k_conv.data(), w.v_conv.data(), q, k, v, stream_));
  }
  {
    const ProfRegion region(prof_, "kda/gates", stream_);
    K3_CUDA_CHECK(cuda::kda_gates(static_cast<int>(N), H, D, graw.f(), w.dt_bias.data(), w.A_log.data(), gate.bounded,
                                  gate.lower_bound, braw.f(), stream_, g));
  }
  {
    const ProfRegion region(prof_, "kda/chunk", stream_);
    K3_CUDA_CHECK(cuda::kda_chunked_tc(staged<const KdaSeq>(sd_.kda_chk[li]), sd_.n_chk, static_cast<int>(N), H, D,
                                       sd_.kda_chunk == 64 ? 64 : 32, KdaInType::BF16, q, k, v, g, braw.f(), o.f(),
                                       nullptr, KdaTcTuning{}, kda_ws_.get(), kda_ws_.bytes(), stream_,
                                       kda_tc_any_decay_ ? KdaDecays::Any : KdaDecays::Bounded));
  }
  kda_output_gate(w, d, eps, o, gate_proj);
}

void CudaBackend::kda_mix(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate,
                          float eps, Tensor pq, Tensor pk, Tensor pv, Tensor graw, Tensor braw, Tensor gate_proj,
                          Tensor o) {
  prof_.begin("kda core", stream_);
  if (plan_->all_decode()) {
    K3_CUDA_CHECK(kda_decode_fused_typed(staged<const KdaSeq>(sd_.kda_all[static_cast<size_t>(layer)]), static_cast<int>(n_seqs_),
                                   static_cast<int>(d.heads), static_cast<int>(d.head_dim), static_cast<int>(d.conv), pq.f(),
                                   pk.f(), pv.f(), w.q_conv.data(), w.k_conv.data(), w.v_conv.data(), graw.f(),
                                   w.dt_bias.data(), w.A_log.data(), gate.bounded, gate.lower_bound, braw.f(), gate_proj.f(),
                                   w.o_norm.data(), eps, o.f(), spec_.kda_state_dtype, stream_));
  } else if (!sd_.kda_verify.empty()) {
    const KdaFusedIn in{pq.f(), pk.f(), pv.f(), w.q_conv.data(), w.k_conv.data(), w.v_conv.data(), graw.f(),
                        w.dt_bias.data(), w.A_log.data(), gate.bounded, gate.lower_bound, braw.f(), gate_proj.f(),
                        w.o_norm.data(), eps};
    const size_t li = static_cast<size_t>(layer);
    K3_CUDA_CHECK(kda_verify_fused(staged<const KdaSnapSeq>(sd_.kda_verify[li]), static_cast<int>(n_seqs_),
                                   staged<const KdaSeq>(sd_.kda_snaps[li]), static_cast<int>(d.heads),
                                   static_cast<int>(d.head_dim), static_cast<int>(d.conv), in, o.f(),
                                   spec_.kda_state_dtype, stream_));
  } else if (kda_bf16_prefill_ok()) {
    kda_prefill_bf16(layer, w, d, gate, eps, pq, pk, pv, graw, braw, gate_proj, o);
  } else {
    Backend::kda_mix(layer, w, d, gate, eps, pq, pk, pv, graw, braw, gate_proj, o);
  }
  prof_.end(stream_);
}

}  // namespace k3::cuda
