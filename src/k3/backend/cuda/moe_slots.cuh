// The MoE plan's slot layout on the device (moe_kernels.cu plan_kernel: pairs grouped by expert, expert e's slots
// [off[e], off[e + 1])): which expert a slot belongs to. Shared by the CUTLASS path's merged Bf16x2 rows
// (sm90a/moe_grouped_gemm.cu) and the combine that reads them (moe_decode.cu).
#pragma once
#include <cstdint>

namespace k3::cuda::moe_dev {

// The expert of slot s < off[E]: the last e with off[e] <= s (experts without slots are skipped past). off: [E + 1].
__device__ __forceinline__ int expert_of_slot(const int32_t* __restrict__ off, int E, int s) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(off + mid) <= s) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace k3::cuda::moe_dev
