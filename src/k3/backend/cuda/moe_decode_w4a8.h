// The routed experts of a decode-sized batch as MXFP4 weights x MXFP8 activations on Hopper's FP8 tensor cores
// (sm90a/moe_decode_w4a8.cu): the numerics of --moe-activation-dtype mxfp8 (core/mxfp8.h: each expert input row and
// each GLU output rounded to MXFP8 -- what K3 was trained with), the kernels scripts/perf/w4a8_bench.cu prototyped.
// Why: the bf16 decode kernels (moe_decode.cu) are issue-bound at ~7.5 instructions per weight byte, most of them
// placing E2M1 pairs as bf16 and scaling them; as e4m3 a register holds 4 weights placed in ~3.5 ops, and the scales
// move to the fp32 accumulators (one wgmma m64n8k32 per 32-input group): ~4.2 instructions a byte (SASS, session 55).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda {

// Whether moe_w4a8_experts runs `w` here: MXFP4 experts, I and X multiples of 128, a compute-capability-9.0 device.
bool moe_w4a8_supported(const ExpertBank& w);

// Device scratch of moe_w4a8_experts (moe_experts carves it from its workspace's buffers).
struct W4a8Scratch {
  uint8_t* x8 = nullptr;  // [n][X] e4m3 codes of the tokens' rows
  uint8_t* xs = nullptr;  // [n][X / 32] their E8M0 scales
  uint8_t* h8 = nullptr;  // [P][I] codes of the GLU outputs by slot
  uint8_t* hs = nullptr;  // [P][I / 32]
  float* part = nullptr;  // split-K partials: [splits][P][2 I] (gate | up), then [splits][P][X] (down) over them
  int64_t part_floats = 0;
  int max_tokens = 0, max_pairs = 0;
};

// out [n][X] = sum over each token's K experts in rank order of topk_w * down(glu(gate x8, up x8) as MXFP8), the tiles
// plan_kernel cut with 8 pairs each (tok 8; else cudaErrorInvalidValue). Launches: x -> MXFP8, gate|up (partials), the
// GLU of the summed partials -> MXFP8 by slot, down (partials), moe_combine. The partial sums are added in a fixed
// order: results do not depend on the schedule.
cudaError_t moe_w4a8_experts(const ExpertBank& w, int n, int K, int tok, const float* x, const int32_t* sorted,
                             const int32_t* slot_of, const int4* tiles, const int32_t* num_tiles, int tiles_bound,
                             const float* topk_w, GluAct act, float beta, float lbeta, float* out, const W4a8Scratch& s,
                             cudaStream_t stream);

}  // namespace k3::cuda
