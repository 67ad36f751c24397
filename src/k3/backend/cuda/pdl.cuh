// Programmatic dependent launch (Hopper; CUDA programming guide, "Programmatic Dependent Launch and
// Synchronization"): a kernel launched with pdl::launch may begin while the kernel before it on the stream is still
// running -- as soon as every block of that kernel has executed griddepcontrol.launch_dependents (or exited) -- and
// its griddepcontrol.wait returns once that kernel has completed and its writes are visible.
//
// Why: a decode step at batch 1 is ~100 small kernels, most of them GEMVs that read a few MB of weights each (call
// s31-1: 32 Q6_K GEMVs of 3.3 MB at 0.42 TB/s, 8 us each, while the 310 MB head streams at 1.5 TB/s). Each pays a
// launch, its blocks' dispatch and a first DRAM round trip before its stream is full, then a tail. The weights do not
// depend on the kernels before it, so a GEMV can request them before it waits, overlapping that ramp with the previous
// kernel's tail.
//
// The contract of a kernel launched with pdl::launch:
//   1. before pdl::wait() it reads only memory the kernel just before it does not write -- the checkpoint's weights
//      (uploaded by copies before the first step, never by a kernel), or state only earlier kernels wrote (complete
//      when this one starts: the transitivity below; the KDA decode kernel's state, session 46) -- and writes nothing;
//   2. it calls pdl::wait() before any other global memory access, on every path (a block that returns before
//      waiting must have read nothing else and written nothing);
//   3. it calls pdl::launch_dependents() after pdl::wait() (pdl::begin() does both): its own successor may then
//      start, and no more than two kernels of the stream are ever in flight -- waiting blocks hold an SM's slots.
// A kernel that is not launched this way may still call pdl::launch_dependents() first thing (it is running, so its
// predecessor is done): a pdl-launched successor can then prefetch during it. Transitivity: a kernel's wait returns
// after its predecessor completed, which waited for its own predecessor, so every earlier kernel is complete too.
//
// K3_PDL=0 launches without the attribute (every wait then returns at once): the A/B switch for timing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace k3::cuda::pdl {

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// bytes from p (any alignment) requested into L2, one 128-byte line per thread and step: thread tid of nthreads. A
// request costs an issue slot and no register beyond the address; the line is then read from L2, not DRAM (session
// 32: loading the first parts into registers instead raised v3's registers 64 -> 80 and its blocks per SM 4 -> 3).
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes, int tid, int nthreads) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), first = b & ~uintptr_t{127}, end = b + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = first + static_cast<uintptr_t>(tid) * 128; a < end; a += static_cast<uintptr_t>(nthreads) * 128)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
}

// The usual start of a pdl-launched kernel once its weight-only prologue (if any) is issued.
__device__ __forceinline__ void begin() {
  wait();
  launch_dependents();
}

// Whether launches carry the attribute (K3_PDL unset or not "0"); read once.
inline bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("K3_PDL");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

// kernel<<<grid, block, smem, s>>>(args...) with programmatic stream serialization; returns the launch's status.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace k3::cuda::pdl
