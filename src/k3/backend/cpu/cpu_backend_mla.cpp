// CpuBackend's MLA ops (model-spec 3.3): the latent cache write, the absorbed (decode) form as absorb /
// attend / up-projection over decode-form sequences, and the MHA (prefill) form per prefill-form sequence.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/mla_absorb.h"
#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/mla_cache_rows.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/thread_pool.h"

namespace k3::cpu {

using graph::Tensor;

namespace {
bool decode_form(const graph::StepSeq& s) { return !s.prefill_form; }
bool prefill_form(const graph::StepSeq& s) { return s.prefill_form; }
}  // namespace

std::vector<const void*> CpuBackend::latent_rows(const graph::StepSeq& s, int64_t layer) {
  const MlaPageTable pt = s.cache->mla_pages();
  std::vector<const void*> rows(static_cast<size_t>(s.past + s.n));
  for (int64_t p = 0; p < s.past + s.n; ++p) rows[static_cast<size_t>(p)] = pt.row(layer, p);
  return rows;
}

void CpuBackend::mla_write_latents(int64_t layer, const graph::MlaDims& d, Tensor lat) {
  CpuOpProfile::Scope ps(prof_, "mla_write_latents");
  std::vector<void*> rows;
  for (const graph::StepSeq& s : plan_->seqs) {
    const MlaPageTable pt = s.cache->mla_pages();
    rows.clear();
    for (int64_t t = 0; t < s.n; ++t) rows.push_back(pt.row(layer, s.past + t));
    mla_write_rows(s.cache->spec().mla_dtype, static_cast<int>(s.n), static_cast<int>(d.rank), static_cast<int>(d.rope),
                   lat.row(s.offset), rows.data());
  }
}

// Both absorbed-form projections stream kv_b (mla_absorb.h: as stored -- bf16 on K3 checkpoints, a quantised GGUF's
// attn_k_b / attn_v_b blocks): in parallel over (token, head) so a batch-1 step reads it with every thread; each
// (token, head) is computed the same way on any thread.
namespace {
// K3_MLA_STORED_HALVES=0: the fp32 rebuild instead of a GGUF's quantised halves (the A/B; read per call so that a
// test can switch it).
bool stored_halves_on() {
  const char* e = std::getenv("K3_MLA_STORED_HALVES");
  return e == nullptr || std::strcmp(e, "0") != 0;
}

KvB kv_b_of(const MlaWeights& w, const graph::MlaDims& dm) {
  KvB k;
  k.nope = dm.nope, k.value = dm.value, k.rank = dm.rank;
  if (stored_halves_on() && !w.k_b_blocks.empty() && !w.v_b_blocks.empty() && w.k_b_blocks.device == kHostDevice && w.v_b_blocks.device == kHostDevice) {
    k.k_b = &w.k_b_blocks;  // a GGUF's quantised halves as stored: a third to a quarter of the fp32 rebuild's bytes
    k.v_b = &w.v_b_blocks;
  } else if (w.kv_b_stored.format == WeightFormat::BF16 && w.kv_b_stored.data && w.kv_b_stored.device == kHostDevice)
    k.bf16 = static_cast<const uint16_t*>(w.kv_b_stored.data);
  else
    k.f32 = w.kv_b.data();
  return k;
}
}  // namespace

void CpuBackend::mla_absorb_q(const MlaWeights& w, const graph::MlaDims& dm, Tensor q, Tensor ql) {
  CpuOpProfile::Scope ps(prof_, "mla_absorb_q");
  const int64_t nh = dm.heads, qk = dm.qk(), cd = dm.row();
  const KvB kvb = kv_b_of(w, dm);
  for_seqs(decode_form, [&](const graph::StepSeq& s) {
    parallel_for(s.n * nh, s.n * nh > 1, [&](int64_t i) {
      const int64_t t = s.offset + i / nh, h = i % nh;
      mla_absorb_q_head(kvb, h, dm.rope, q.f() + (t * nh + h) * qk, ql.f() + (t * nh + h) * cd);
    });
  });
}

void CpuBackend::mla_attend_latent(int64_t layer, const graph::MlaDims& dm, Tensor ql, float scale, Tensor ol) {
  CpuOpProfile::Scope ps(prof_, "mla_attend_latent");
  const int64_t nh = dm.heads, kr = dm.rank, cd = dm.row();
  for_seqs(decode_form, [&](const graph::StepSeq& s) {
    const std::vector<const void*> rows = latent_rows(s, layer);
    mla_attention_latent_rows_typed(static_cast<int>(s.n), static_cast<int>(s.past), static_cast<int>(nh),
                                    static_cast<int>(kr), static_cast<int>(dm.rope), ql.f() + s.offset * nh * cd, rows.data(),
                                    s.cache->spec().mla_dtype, scale, ol.f() + s.offset * nh * kr);
  });
}

void CpuBackend::mla_up_v(const MlaWeights& w, const graph::MlaDims& dm, Tensor ol, Tensor o) {
  CpuOpProfile::Scope ps(prof_, "mla_up_v");
  const int64_t nh = dm.heads, dv = dm.value, kr = dm.rank;
  const KvB kvb = kv_b_of(w, dm);
  for_seqs(decode_form, [&](const graph::StepSeq& s) {
    parallel_for(s.n * nh, s.n * nh > 1, [&](int64_t i) {
      const int64_t t = s.offset + i / nh, h = i % nh;
      mla_up_v_head(kvb, h, ol.f() + (t * nh + h) * kr, o.f() + (t * nh + h) * dv);
    });
  });
}

// The absorbed form in ONE parallel pass over (decode-form sequence, token, heads): absorb, attend and
// up-project each piece on one thread (three fork-joins per MLA layer before, ~100 us of a batch-1 step's MLA
// layer at 16 threads for ~20 us of kv_b bytes: session 26's profile). Pieces are single heads unless there
// are enough head blocks to fill the pool (then kHeadBlock heads share each decoded bf16 / fp8 row, as in
// mla_attention_latent_rows_typed); every (token, head) gets the arithmetic of the three separate ops.
void CpuBackend::mla_absorbed(int64_t layer, const MlaWeights& w, const graph::MlaDims& dm, Tensor q, float scale,
                              Tensor o) {
  CpuOpProfile::Scope ps(prof_, "mla_absorbed");
  const int64_t nh = dm.heads, qk = dm.qk(), cd = dm.row(), kr = dm.rank, dv = dm.value;
  constexpr int64_t kBlock = 8;  // mla_attention.cpp's kHeadBlock
  struct Piece {
    const graph::StepSeq* s;
    int64_t t;  // token within the sequence
    size_t r;   // the sequence's entry in rows
  };
  std::vector<Piece> tokens;
  std::vector<std::vector<const void*>> rows;  // per decode-form sequence
  for (const graph::StepSeq& s : plan_->seqs) {
    if (s.prefill_form) continue;
    rows.push_back(latent_rows(s, layer));
    for (int64_t t = 0; t < s.n; ++t) tokens.push_back({&s, t, rows.size() - 1});
  }
  if (tokens.empty()) return;
  const int64_t ntok = static_cast<int64_t>(tokens.size());
  const int64_t hb = ntok * ((nh + kBlock - 1) / kBlock) >= 4 * ThreadPool::global().size() ? kBlock : 1;
  const int64_t nhb = (nh + hb - 1) / hb;
  graph::ScratchScope scope(*this);
  Tensor ql = scratch(q.rows, nh * cd, graph::ElemType::F32), ol = scratch(q.rows, nh * kr, graph::ElemType::F32);
  const KvB kvb = kv_b_of(w, dm);
  if (kvb.k_b && ntok > 1) {
    // A GGUF's quantised halves: each head's rows decoded once for every token (one piece per head; pieces of
    // (token, head) decoded them once per token and lost to the fp32 copy at batch 8; now 463-474 us a layer vs its
    // 731-743, kl-1b Q4_K_M, 2 threads, docs/perf/cpu.md session 34). Each (token, head) gets the pieces' arithmetic.
    // Token chunks too when the heads alone give fewer than ~4 pieces a thread (few heads, many threads; k3-tiny's 4
    // heads on 2 threads in the tests): each chunk decodes its head's rows once.
    const int64_t chunks = std::clamp<int64_t>((4 * ThreadPool::global().size() + nh - 1) / nh, 1, ntok);
    const int64_t per = (ntok + chunks - 1) / chunks;
    parallel_for(nh * chunks, true, [&](int64_t piece) {
      const int64_t h = piece % nh, t0 = piece / nh * per, tn = std::min(per, ntok - t0);
      if (tn <= 0) return;
      thread_local std::vector<const float*> in;
      thread_local std::vector<float*> out;
      thread_local std::vector<float> scratch_f;
      in.resize(static_cast<size_t>(tn)), out.resize(static_cast<size_t>(tn));
      for (int64_t i = 0; i < tn; ++i) {
        const Piece& pc = tokens[static_cast<size_t>(t0 + i)];
        const int64_t row = pc.s->offset + pc.t;
        in[static_cast<size_t>(i)] = q.f() + (row * nh + h) * qk, out[static_cast<size_t>(i)] = ql.f() + (row * nh + h) * cd;
      }
      mla_absorb_q_head_n(kvb, h, dm.rope, tn, in.data(), out.data());
      for (int64_t i = 0; i < tn; ++i) {
        const Piece& pc = tokens[static_cast<size_t>(t0 + i)];
        const graph::StepSeq& s = *pc.s;
        mla_attention_latent_rows_heads(static_cast<int>(pc.t), static_cast<int>(h), 1, static_cast<int>(s.past), static_cast<int>(nh),
                                        static_cast<int>(kr), static_cast<int>(dm.rope), ql.f() + s.offset * nh * cd, rows[pc.r].data(),
                                        s.cache->spec().mla_dtype, scale, ol.f() + s.offset * nh * kr, scratch_f);
        const int64_t row = s.offset + pc.t;
        in[static_cast<size_t>(i)] = ol.f() + (row * nh + h) * kr, out[static_cast<size_t>(i)] = o.f() + (row * nh + h) * dv;
      }
      mla_up_v_head_n(kvb, h, tn, in.data(), out.data());
    });
  } else {
    parallel_for(ntok * nhb, true, [&](int64_t i) {
      const Piece& pc = tokens[static_cast<size_t>(i / nhb)];
      const graph::StepSeq& s = *pc.s;
      const int64_t row = s.offset + pc.t, h0 = (i % nhb) * hb, hn = std::min(hb, nh - h0);
      for (int64_t h = h0; h < h0 + hn; ++h)
        mla_absorb_q_head(kvb, h, dm.rope, q.f() + (row * nh + h) * qk, ql.f() + (row * nh + h) * cd);
      // The sequence's own rows, its queries from its first row: token t attends to past + t + 1 rows.
      thread_local std::vector<float> scratch_f;
      mla_attention_latent_rows_heads(static_cast<int>(pc.t), static_cast<int>(h0), static_cast<int>(hn), static_cast<int>(s.past),
                                      static_cast<int>(nh), static_cast<int>(kr), static_cast<int>(dm.rope),
                                      ql.f() + s.offset * nh * cd, rows[pc.r].data(),
                                      s.cache->spec().mla_dtype, scale, ol.f() + s.offset * nh * kr, scratch_f);
      for (int64_t h = h0; h < h0 + hn; ++h)
        mla_up_v_head(kvb, h, ol.f() + (row * nh + h) * kr, o.f() + (row * nh + h) * dv);
    });
  }
  if (observer_) {
    std::vector<int64_t> obs_rows;
    obs_rows.reserve(tokens.size());
    for (const Piece& pc : tokens) obs_rows.push_back(pc.s->offset + pc.t);
    observer_->on_mla_absorbed(w, dm, q.f(), ol.f(), obs_rows);
  }
}

// MHA form for one sequence: expand k_nope / v for every cached token from the latents.
void CpuBackend::mla_attend_mha(int64_t layer, const MlaWeights& w, const graph::MlaDims& dm, Tensor q, float scale,
                                Tensor o) {
  CpuOpProfile::Scope ps(prof_, "mla_attend_mha");
  const int64_t nh = dm.heads, dn = dm.nope, dr = dm.rope, dv = dm.value, kr = dm.rank, qk = dm.qk();
  for_seqs(prefill_form, [&](const graph::StepSeq& s) {
    const int64_t S = s.past + s.n;
    const std::vector<const void*> rows = latent_rows(s, layer);
    std::vector<float> lat(static_cast<size_t>(S * (kr + dr)));
    mla_gather_rows(s.cache->spec().mla_dtype, static_cast<int>(S), static_cast<int>(kr), static_cast<int>(dr), rows.data(),
                    lat.data());
    // kv_b's input is c_kv alone (contiguous rows); k_pe and kv_b's output are read in place.
    std::vector<float> clat(static_cast<size_t>(S * kr)), kv(static_cast<size_t>(S * nh * (dn + dv)));
    for (int64_t p = 0; p < S; ++p) {
      const float* r = lat.data() + p * (kr + dr);
      std::copy(r, r + kr, clat.data() + p * kr);
    }
    // kv_b as stored (bf16 on these checkpoints) when it is on the host: the tier's kernel for it (vdpbf16ps
    // in avx512bf16) reads half the bytes of the fp32 copy; the exact tiers widen bf16 exactly.
    const bool stored = w.kv_b_stored.data && w.kv_b_stored.device == kHostDevice;
    matmul(stored ? w.kv_b_stored : w.kv_b_f32, clat.data(), S, kv.data());
    mla_attention_mha_kv(static_cast<int>(s.n), static_cast<int>(s.past), static_cast<int>(nh), static_cast<int>(dn),
                         static_cast<int>(dr), static_cast<int>(dv), q.f() + s.offset * nh * qk, kv.data(), lat.data() + kr,
                         kr + dr, scale, o.f() + s.offset * nh * dv);
  });
}

}  // namespace k3::cpu
