// The token-sampling algorithm, specified once and implemented twice: sample_row() below (the host
// reference; what the CPU backend and every host-side sampler run) and the CUDA kernel
// (backend/cuda/sampling_kernels.cu). Both must pick the same token from the same logits and the same
// uniform draw, so every decision is made on values both sides compute identically:
//   s = (l - max) / T          IEEE float (no FMA possible)
//   w = float(exp(double(s)))  correctly rounded on both sides except in ~1e-8-rare straddles
//   W = trunc(w * 2^B)         a fixed-point weight (B = fixed_point_bits(V)); every mass, top-p
//                              target and draw is an exact uint64 sum, independent of summation order
// so a parallel reduction on the GPU and the sequential loop here agree bit for bit.
// Semantics (vLLM/OpenAI names; docs/sampling.md): logit_bias -> grammar mask (allowed ids) -> penalties ->
// mask ids >= n_tokenizable -> greedy |
// temperature -> top-k (ties at the k-th kept) -> top-p (smallest prefix by (w desc, id asc) whose mass
// reaches top_p) -> min-p (w < min_p dropped) -> draw r = floor(u * Z) in id order.
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <string>

namespace k3::sampling {

// What picks one row's next token. Spans are borrowed for the duration of the call.
struct RowSampling {
  float temperature = 1.0f;  // 0: greedy (argmax, ties to the lowest id)
  int top_k = 0;             // <= 0 or >= V: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::span<const int32_t> repetition_ids;  // distinct ids the repetition penalty applies to (prompt ∪ generated)
  std::span<const int32_t> counted_ids;     // distinct generated ids ...
  std::span<const int32_t> counts;          // ... and how often each was generated (presence/frequency)
  int64_t n_tokenizable = std::numeric_limits<int64_t>::max();  // ids >= this are never sampled
  // Structured outputs (a grammar's token mask): bit (i % 32) of allowed[i / 32] set <=> id i may be
  // sampled; ids past the mask's words may not. Empty: every id may.
  std::span<const uint32_t> allowed;
  // logit_bias (OpenAI): logits[bias_ids[j]] += bias_values[j], before the mask and the penalties.
  std::span<const int32_t> bias_ids;
  std::span<const float> bias_values;
  double u = 0.0;  // the uniform draw in [0, 1) (unused when greedy)

  bool greedy() const { return temperature == 0.0f; }
  bool constrained() const { return !allowed.empty() || !bias_ids.empty(); }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

enum class SampleStatus : int32_t { Ok = 0, NaN = 1, PosInf = 2, AllMasked = 3, BadId = 4 };

struct SampleResult {
  int32_t token = -1;
  SampleStatus status = SampleStatus::Ok;
  int32_t at = -1;  // the offending id for NaN / +inf / a penalty id out of range
};

// Fixed-point bits of the weights: the largest B with V * 2^B < 2^62 (so every sum fits a uint64),
// at most 52.
int fixed_point_bits(int64_t vocab);

// Step 1 alone: the repetition then presence/frequency penalties of `r`, in place. Returns BadId (with
// the id) for a penalty id outside [0, V), else Ok.
SampleResult apply_penalties(std::span<float> logits, const RowSampling& r);

// Step 0 alone: logit_bias, then the grammar mask (-inf for every id not allowed), in place. Returns
// BadId (with the id) for a bias id outside [0, V), else Ok.
SampleResult apply_bias_and_mask(std::span<float> logits, const RowSampling& r);

// Samples one row. `logits` is modified in place: on return it holds the penalised, masked logits
// (greedy) or s = (l - max) / T for the surviving ids and -inf for every filtered one.
SampleResult sample_row(std::span<float> logits, const RowSampling& r);

// "NaN logit at id 17", ... (for Ok: "ok").
std::string describe(const SampleResult& r);

// The weight of logit l (max lmax, temperature T) and its fixed-point form; shared with the kernel's
// documentation so the two stay one definition.
float weight_of(float l, float lmax, float T);
inline uint64_t fixed_weight(float w, int bits) {
  return static_cast<uint64_t>(static_cast<double>(w) * static_cast<double>(uint64_t{1} << bits));
}
// ceil(top_p * Z), at least 1: the mass the top-p prefix must reach.
uint64_t top_p_target(float top_p, uint64_t Z);
// floor(u * Z) clamped to Z - 1: the draw's position in the cumulative mass.
uint64_t draw_position(double u, uint64_t Z);

}  // namespace k3::sampling
