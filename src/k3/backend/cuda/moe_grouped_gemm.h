// The routed experts at prefill sizes as CUTLASS grouped GEMMs (sm_90a: TMA loads, warp-specialised wgmma, a
// persistent scheduler over every expert's tiles; sm90a/moe_grouped_gemm.cu says how), for BF16 expert banks.
//
// Why: the hand-written wgmma tiles (moe_prefill_wgmma.h) ran the Kimi-Linear-48B MoE layer of a 4096-token prefill
// at ~108 TFLOP/s useful (4.31 ms a layer, call s41-3, H200), 11% of the bf16 peak; they stage every operand through
// registers and issue one 64-pair tile per block. A grouped GEMM with TMA operands and a producer warp is what the
// Hopper libraries reach 50-70% of peak with at ~128 rows a group (vLLM's and SGLang's MoE prefill on Hopper).
//
// Contract: the plan's slots (moe_kernels.cu plan_kernel: pairs grouped by expert, expert e's rows
// [expert_off[e], expert_off[e + 1])). Stages, all on `stream`:
//   x rows gathered by slot into bf16 (hi, and lo = bf16(x - hi) with `split`: MoePrecision::Bf16x2);
//   gate and up as one grouped launch of 2 E GEMMs, fp32 out -- with `split`, each expert's hi and lo rows merged into
//   one group of 2 m rows (256-row tiles past 80 pairs an expert), so that a weight tile is loaded once for both
//   halves (the two-launch form, a second accumulating launch for the lo halves, read every expert matrix twice;
//   K3_MOE_CUTLASS_X2=two keeps it for A/B);
//   GLU in fp32 (of the halves' sum), h rounded to bf16 (hi, lo);
//   down, E GEMMs, fp32 out by slot (merged rows with `split`; bf16 out at Bf16 precision) -- the caller combines
//   (Output says how).
// Numerics: the tiles' (bf16 products, fp32 sums); only the summation order differs. Measured (call s57-1, H200,
// docs/perf/cuda.md "Session 57"): the Kimi-Linear bank's 4096-token layer 1.87 ms at bf16 (248 TFLOP/s useful).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda::moe_cutlass {

// Scratch / ScratchPtr (moe_kernels.h: a MoeWorkspace holds one): device buffers (the bf16 activations) and the
// CUTLASS kernels' bound arguments (their device arrays of problem shapes, pointers and strides, filled by a kernel
// per launch from the plan), made on first use for the workspace's largest batch.

// Whether this path runs here: a compute-capability-9.0 device (sm_90a code only), BF16 experts, X and I multiples of
// 8 (16-byte TMA rows), I <= X (the up outputs and the GLU's bf16 rows reuse buffers sized by X).
bool supports(const ExpertBank& w);

// Whether Auto's tensor-core choice takes it for BF16 banks: yes unless K3_MOE_CUTLASS=0 (call s57-1, H200, Kimi-Linear
// bank: n = 4096 3.45 vs 4.43 ms at bf16x2, 1.87 vs 4.29 at bf16 against the wgmma tiles; n = 2048 2.46 vs 2.79 / 1.29
// vs 2.70; the Kimi-Linear-dims slice's pp4096 +10-13% / +38%). MoePath::Cutlass forces it.
bool enabled_by_env();

// Rows of the output tiles for `pairs` (token, expert) pairs over E experts: 64 up to 96 pairs an expert, else 128
// (s57-1: 64 faster by 5% at 64 pairs an expert and 17% at 8, slower by 4-5% at 128); K3_MOE_CUTLASS_TILE=64|128 at
// start-up, or set_tile_m(64 | 128), forces one (set_tile_m(0): the rule again; tests and timings).
int tile_m(int pairs, int E);
void set_tile_m(int m);

struct Args {
  const ExpertBank* w = nullptr;
  int n = 0, K = 0;                      // tokens, experts a token
  const float* x = nullptr;              // [n][X]
  const int32_t* sorted = nullptr;       // [P] slot -> pair (t * K + k)
  const int32_t* expert_off = nullptr;   // [E + 1] first slot of each expert; [E] = the valid pairs
  GluAct act = GluAct::SiLU;
  float beta = 0.f, lbeta = 0.f;         // SiTU's
  bool split = true;                     // Bf16x2: hi + lo halves of x and h (two products each)
  float* hidden = nullptr;               // [P][I] fp32 scratch (gate's outputs)
  float* y = nullptr;                    // [P][X] fp32: up's outputs as [P][I], then down's by slot
};

// Whether run() can go ahead on `stream`: its scratch exists, or the stream is not being captured into a CUDA graph
// (making the scratch allocates device memory, which a capture does not allow; the caller then takes the tiles).
bool can_run_on(const ScratchPtr& scratch, cudaStream_t stream);

// Where run() left down's products: `splits` partials [P][X] by slot, `split_stride` floats apart, for moe_combine (a.y,
// 0, 1); or, with merged_off (Bf16x2's one-launch form: its own scratch), each slot's hi and lo rows at the merged rows
// of the plan's expert offsets, for moe_combine_merged.
// bf16: part holds bf16 rows (the Bf16 precision's outputs: moe_combine_bf16).
struct Output {
  const float* part = nullptr;
  int64_t split_stride = 0;
  int splits = 1;
  const int32_t* merged_off = nullptr;
  bool bf16 = false;
};

// The merged groups' tile rows for `pairs` pairs over E experts: 256 when they average more than 160 rows, else
// tile_m's rule for their 2 x pairs rows.
int tile_m_merged(int pairs, int E);

// The stages above. max_pairs: the workspace's P bound (the scratch is sized by it once; the one-launch Bf16x2 form
// adds max(4 I, 2 X) max_pairs floats on first use). cudaErrorInvalidValue where !supports(*a.w) or a pointer is
// missing; cudaErrorMemoryAllocation if the scratch cannot be made.
cudaError_t run(const Args& a, int max_pairs, ScratchPtr& scratch, cudaStream_t stream, Output* out);

// Bf16x2's two-launch form (true) or the one-launch form (false, the default unless K3_MOE_CUTLASS_X2=two): tests and
// timings. The outputs are the same bits.
void set_split_two_launches(bool two);

// At Bf16 precision the GEMMs write bf16 (true, the default unless K3_MOE_CUTLASS_BF16_OUT=0) or fp32 (A/B, tests):
// outputs rounded to bf16 once more (within the precision's tolerance), half the output bytes.
void set_bf16_outputs(bool on);

}  // namespace k3::cuda::moe_cutlass
