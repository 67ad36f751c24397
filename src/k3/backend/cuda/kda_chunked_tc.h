// Chunked KDA prefill on tensor cores (sm_90 mma.sync m16n8k16, bf16 operands, fp32 accumulation and
// state). Same recurrence, sequences, states and output as kda_chunked (kda_kernels.h), but the
// activations are rounded to bf16 once (q, k, v as read, and the derived operands W, U, Q exp(G),
// exp(G_last - G) k, A_qk, the inverse T, the state copy used in products, the corrected values V~),
// so results match the fp32 path to bf16 accuracy (~1e-2 relative), not to fp32 rounding. The fp32
// recurrent state itself is carried in registers across chunks and stored in fp32.
//
// Preconditions beyond kda_chunked's: D = 128; chunk 32 or 64; with KdaDecays::Bounded (the default) every per-token
// log decay g >= -5.5 (the bounded gate with lower_bound >= -5.5): the intra-chunk products factor exp(G_i - G_j) per
// 16-token sub-chunk around its first row, which needs exp(15 * 5.5) to stay in float range; decays below that are
// clamped (finite but wrong results). KdaDecays::Any (an unbounded gate: Kimi-Linear's) sums the two diagonal
// 16 x 16 blocks of each chunk's products exactly in fp32 instead (kda_tc_intra2.cuh, IntraExactCfg) and is right
// for any g <= 0; chunk 32 only, always the two-kernel path with the v2-form intra kernel (the tuning's intra,
// overlap and fused knobs do not apply).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "k3/backend/cuda/kda_kernels.h"

namespace k3::cuda {

enum class KdaInType { F32, BF16 };  // element type of q, k, v, g (beta is always fp32)
enum class KdaDecays { Bounded, Any };  // per-token log decays >= -5.5 (the bounded gate), or any <= 0

// Workspace for kda_chunked_tc (16-byte aligned): about (4 C + H chunk) bf16 per row plus D floats and one
// 32-bit flag per (chunk, head).
size_t kda_chunked_tc_workspace_bytes(int n_total_tokens, int n_seqs, int H, int D, int chunk);

// Number of chunks of a call (sum over sequences of ceil(n / chunk)): the row count of chunk_states.
// Host-side helper for callers that know the lengths.
inline int kda_chunk_count(const int* lens, int n_seqs, int chunk) {
  int total = 0;
  for (int i = 0; i < n_seqs; ++i) total += lens[i] > 0 ? (lens[i] + chunk - 1) / chunk : 0;
  return total;
}

// Launch shape of the state kernel (0 = chosen from the shape): value columns per block (32 or 64; 128, chunk
// 32 only: one 8-warp block per sequence and head, W / Q / Kd read once per head) and operand buffers (1:
// refilled piecewise; 2: the next chunk prefetched while this one runs; 3, chunk 32 only: two chunks ahead).
// intra: the intra-chunk kernel, 1 = v1 (2 warps per chunk and head, serial cumsum and substitution), 2 = v2
// (8 warps, shuffle scan, blocked inverse; chunk 32 only, chunk 64 always runs v1), 3 = v2 compiled for 4
// blocks per SM (64 registers, some spills; A/B), 4 = v3 (v2 persistent: one block per resident slot walking the
// (chunk, head) items, the next item's loads in flight during the current one's compute; outputs bit-identical
// to v2's; chunk 32 with bf16 inputs, fp32 inputs run v2), 5 = v3 with streaming stores (the default: v2's bits,
// 4-6% faster, call s26-1), 0 = the environment's K3_KDA_TC_INTRA (v1 | v2 | v2x4 | v3 | v3cs; unset = v3cs). Same outputs up to fp32 rounding order.
// state: the state kernel, 1 = v1 (kda_tc_state_kernel: warps split the key rows of S, value_tile and buffers
// apply), 2 = v2 (kda_tc_state2.cu: warps split the value columns, S^T in registers, no cross-warp exchange per
// chunk; 8 warps = one block per sequence and head), 3 = v2 at 4 warps (two blocks per head); v2 is chunk 32
// only (chunk 64 always runs v1) and ignores value_tile / buffers. 0 = the environment's K3_KDA_TC_STATE (v1 |
// v2 | v2x4), unset: v1 where value_tile or buffers is set, else v2 at chunk 32 (8 warps when sequences x heads
// >= 264, else 4), v1 at chunk 64. v2's chunk states
// equalled v1's exactly in every case checked (scripts/check_kda_tc.py, call s25-6).
// overlap: 1 = off, 2 = on, 0 = on iff the environment has K3_KDA_TC_OVERLAP=1 (default off: measured 1.2-1.4x
// SLOWER than the sequential launch at every shape, call s26-3, docs/perf/cuda.md session 26). On:
// the state kernel starts while the intra kernel is still running (its programmatic dependent launch on the same
// stream; the intra grid capped at fewer blocks per SM to leave room, K3_KDA_TC_OVERLAP_INTRA_PER_SM overrides the
// rule) and takes each (chunk, head) as soon as its flag in the workspace says it is stored. Only for chunk 32
// with bf16 inputs, intra 4 / 5 and state 2 / 3 (state v2 then runs with two operand buffers); anything else,
// fp32 inputs included, runs the sequential launch. Outputs, final and chunk states are BIT-identical to the
// sequential launch's with the same intra and state (same kernels' arithmetic, only the timing changes).
// fused: ONE warp-specialised kernel per (sequence, head) instead of the intra + state pair (kda_tc_fused.cu: producer
// warps do the intra-chunk work of chunk c + 1 into shared memory while consumer warps advance the state over chunk
// c), so W / U / Q / K / A_qk never reach HBM and the workspace is not used. 1 = off; 2 = on, two ring buffers; 3 =
// three; 4 = 2 with every exponential in the ftz form (values below ~1e-38 flush to zero); 5 = 4 with T applied by
// the consumer warps (V~ = T (v - exp(G) k S), rounded differently); 0 = the environment's K3_KDA_TC_FUSED (off / 0,
// 1 or 2, 3, 4, 5), else -- when no two-kernel knob (value_tile, buffers, intra, state, overlap) is set -- the shape
// rule: 5 when sequences x heads >= 96, else off. Only for chunk 32 with bf16 inputs (anything else runs the two-kernel path); value_tile /
// buffers / intra / state / overlap are then ignored. 2 / 3 are bit-identical to intra v3cs + state v2 (outputs,
// final and chunk states) for decays g > -5.45 (kda_tc_fused.cu's exp_ftz says why the bound; checked by
// scripts/check_kda_tc.py and CudaKdaTc.FusedBitwiseEqualsSequential); 4 / 5 within the same error of the fp32
// recurrence. Measured (call s27-kda-2, H200): 1 x 8192 x 96 0.925 ms (5) / 1.025 (2) vs 1.266 for the two kernels;
// 1 x 8192 x 32 0.918 / 1.008 vs 0.610 (32 blocks on 132 SMs: the fused form loses with few sequences x heads).
// The shape rule's measurements: call s28-1 (kda_chunked_tc.cu, fused_rule; docs/perf/cuda/s28-1-kda-sweep.log).
struct KdaTcTuning {
  int value_tile = 0;
  int buffers = 0;
  int intra = 0;
  int state = 0;
  int overlap = 0;
  int fused = 0;
};

// q, k, v, g: [N][C] of `in_type`; beta [N][H] fp32; o [N][C] fp32. chunk_states: nullptr, or [chunks][H][D][D] fp32 receiving
// each sequence's state after each of its chunks, chunks numbered in sequence order (sequence s's chunk c
// is row sum_{s' < s} ceil(n_s' / chunk) + c); the last chunk's entry equals the final state.
// Pointers 16-byte aligned. Asynchronous; graph-capturable.
cudaError_t kda_chunked_tc(const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H, int D, int chunk,
                           KdaInType in_type, const void* q, const void* k, const void* v, const void* g,
                           const float* beta, float* o, float* chunk_states, KdaTcTuning tuning, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, KdaDecays decays = KdaDecays::Bounded);

// Calls of kda_chunked_tc in this process that launched kernels (tests: which prefill path a model took).
unsigned long long kda_chunked_tc_calls();

}  // namespace k3::cuda
