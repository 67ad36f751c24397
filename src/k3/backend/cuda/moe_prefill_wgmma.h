// The routed experts' prefill tiles on warpgroup MMAs (wgmma, sm_90a): sm90a/moe_prefill_wgmma.cu says how.
// The same plan, tiles and outputs as the mma.sync tiles (moe_tc_tile.cuh's expert_tc_kernel, launch_tc in
// moe_kernels.cu): gate+up writes hidden [P][I] by slot (the GLU applied), down writes y [P][X] by slot; the
// caller combines. Weights decoded exactly to bf16 (MXFP4) or read as stored (BF16); activations bf16, split
// into hi + lo halves with `split` (MoePrecision::Bf16x2), rounded once without.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda {
struct TileArgs;  // moe_tc_tile.cuh
}

namespace k3::cuda::moe_wg {

// Whether the current device runs this code (compute capability 9.0: the kernels exist only as sm_90a code)
// and the bank suits it: MXFP4 experts with X, I multiples of 32, or BF16 with X, I multiples of 8.
bool supports(const ExpertBank& w);

// gate+up over the plan's tiles (`gate_up`: gate_up_args of them), then down into y. n_tiles_bound: the grid's
// tile bound (tiles past *num_tiles exit). cudaErrorInvalidValue where !supports(w).
// register_a: the register-A form (MXFP4 only, else cudaErrorInvalidValue): the weights decoded straight into the
// A fragments instead of through shared memory (moe_prefill_wgmma.cu, tile_body_rs).
cudaError_t launch(const ExpertBank& w, int n_tiles_bound, const TileArgs& gate_up, bool split, bool register_a,
                   float* y, cudaStream_t stream);

// The ring form (sm90a/moe_prefill_ring.cu; MXFP4 only): register-A wgmma fed by a cp.async ring of the stored
// MXFP4 bytes and bf16 activation planes in the permuted k order. Needs supports(w), X and I multiples of 64, the
// stacks 16-byte aligned and their scales 2-byte aligned.
bool ring_supports(const ExpertBank& w);
// gate+up then down as launch() does, for n tokens (gate_up.in = x [n][X]). Scratch: x's bf16 planes in y (down's
// output, written after gate+up has read them), the hidden planes in gate_up.out ([max_pairs][I] floats). With
// MoePrecision::Mxfp8's tile form (gate_up.mxfp8_hidden_rows > 0) the GLU outputs are rounded to MXFP8 in gate+up's
// epilogue (no round_hidden_mxfp8 pass: the hidden rows are bf16 planes here). cudaErrorInvalidValue where
// !ring_supports(w).
cudaError_t launch_ring(const ExpertBank& w, int n, int n_tiles_bound, const TileArgs& gate_up, int64_t max_pairs,
                        bool split, float* y, cudaStream_t stream);

// The pairs of the plan's tiles launch_ring takes (128: K3's ~73-pair experts at 4096 tokens in one tile).
int ring_tile_pairs();
// The ring's narrow-scale decode (banks whose MXFP4 scales are all <= 2^1: ExpertStack::max_scale <= 128) unless
// K3_RING_NARROW=0; false forces the general decode on such banks too, nullopt returns to the environment's.
void force_ring_narrow_scales_for_testing(std::optional<bool> on);

// Whether Auto's tensor-core path takes these kernels: yes unless K3_MOE_WGMMA=0 (the mma.sync tiles then; call
// s38-1 on an H200: faster at every timed size, K3 QAT bank n = 4096 50.1 -> 40.6 ms; MoePath::Wgmma forces them).
bool enabled_by_env();
// Whether Auto's wgmma tiles take the register-A form for MXFP4 experts: K3_MOE_WGMMA=rs (MoePath::WgmmaRs forces it).
bool register_a_by_env();
// Whether Auto's wgmma tiles take the ring form for MXFP4 experts that ring_supports: yes unless K3_MOE_WGMMA is
// "smem" (the shared-memory form), "rs" (the register-A form) or "0" (the mma.sync tiles); session 60, call s60-1 on
// an H100: K3's QAT bank 1.35-1.63x the shared-memory form at n = 256..4096, the K3-dims pp4096 +19-30%.
// MoePath::WgmmaRing forces it.
bool ring_by_default();

}  // namespace k3::cuda::moe_wg
