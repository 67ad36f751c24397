// Does compute-sanitizer's racecheck follow mbarrier phases? (session 52: it reported write-write hazards between the
// MLA wgmma kernel's producer copies and its consumers' P stores, which the stage's empty mbarrier orders.)
// One block, two warps, a 32-float shared buffer, 4 rounds: the producer warp writes the buffer (st.shared) and arrives
// on `full`; the consumer warp waits on `full`, reads the buffer, writes its own values over it (as the MLA consumers
// store P over a stage's rope block), __syncwarp, one arrival on `empty`; the producer waits on `empty` before the next
// round. Every access is ordered by the barriers (release by arrive, acquire by the completed phase), so a tool that
// models mbarriers reports nothing. mode 1 orders the same rounds with __syncthreads instead (the control: no hazard).
// Build: nvcc -arch=sm_90 -O2 racecheck_mbarrier.cu -o racecheck_mbarrier; run: compute-sanitizer --tool racecheck
// ./racecheck_mbarrier 0 (then 1). Prints the output sum (the same in both modes) for a check that the rounds ran.
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ void mbar_init(unsigned bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}

__global__ void rounds(int mode, float* out) {
  __shared__ float buf[32];
  __shared__ unsigned long long bars[2];
  const unsigned full = static_cast<unsigned>(__cvta_generic_to_shared(&bars[0]));
  const unsigned empty = static_cast<unsigned>(__cvta_generic_to_shared(&bars[1]));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    mbar_init(full, 32);
    mbar_init(empty, 1);
  }
  __syncthreads();
  float acc = 0.f;
  for (int r = 0; r < 4; ++r) {
    if (mode == 0) {
      if (warp == 0) {
        if (r > 0) mbar_wait(empty, (r - 1) & 1);
        buf[lane] = static_cast<float>(r * 32 + lane);
        mbar_arrive(full);  // each lane: its own store released
      } else {
        mbar_wait(full, r & 1);
        acc += buf[lane ^ 1];
        __syncwarp();
        buf[lane] = -1.f;  // the consumer's own values over the buffer (P over the rope block)
        __syncwarp();
        if (lane == 0) mbar_arrive(empty);
      }
    } else {
      if (warp == 0) buf[lane] = static_cast<float>(r * 32 + lane);
      __syncthreads();
      if (warp == 1) acc += buf[lane ^ 1];
      __syncthreads();
      if (warp == 1) buf[lane] = -1.f;
      __syncthreads();
    }
  }
  if (warp == 1) out[lane] = acc;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  float* d = nullptr;
  cudaMalloc(&d, 32 * sizeof(float));
  rounds<<<1, 64>>>(mode, d);
  float h[32];
  cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  double s = 0;
  for (float v : h) s += v;
  std::printf("mode %d sum %.0f (%s)\n", mode, s, cudaGetErrorString(cudaGetLastError()));
  return 0;
}
