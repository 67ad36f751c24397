// The (score, id) argmax a warp agrees on: higher score first, then the lower id (std::max_element's
// first maximum, the CPU's rule). Used by the router's top-k and the drafter's greedy drafts.
#pragma once

namespace k3::cuda {

// (v, i) beats (bv, bi): higher score, then lower id; i < 0 never wins, bi < 0 always loses.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

// The warp's best (score, id) by `better`, in every lane.
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

}  // namespace k3::cuda
