// Token sampling, one 1024-thread block per row (sampling_kernels.h; the algorithm and its exact
// arithmetic are specified in sampling/token_sampling.h, whose sample_row() is the reference).
//
// Passes over the row (it stays in L2; the row is rewritten in place):
//   1 penalties (one thread per listed id) -> 2 mask + max/argmax + NaN check (block reduce)
//   -> [greedy: done] -> 3 top-k: radix select of the k-th largest logit (4 x 8-bit digits, counts)
//   -> 4 weights w (row := w) and their fixed-point total -> 5 top-p: radix select on w's bits with
//   fixed-point mass histograms, then the ties at the threshold in id order -> 6 min-p + the draw: an
//   exclusive scan over per-thread contiguous id ranges finds the first id whose cumulative weight
//   exceeds floor(u * Z).
// Every sum is a uint64 of fixed-point weights, so the parallel order cannot change a decision; float
// ops are the explicit round-to-nearest intrinsics (never contracted into FMAs), as on the host.
// Histogram adds are aggregated per warp (lanes with the same bin reduce first, one shared atomic per
// distinct bin): logits concentrate in a few bins, and plain shared atomics would serialise on them.
#include "k3/backend/cuda/sampling_kernels.h"

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <climits>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace k3::cuda {
namespace {

namespace cg = cooperative_groups;
using u64 = unsigned long long;

constexpr int kThreads = 1024;
enum : int32_t { kOk = 0, kNaN = 1, kPosInf = 2, kAllMasked = 3, kBadId = 4 };
constexpr float kNegInf = -__builtin_huge_valf();

// Order-preserving map of a float to uint32 (total order; -0 < +0, which the callers never rely on).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_order_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Twins of sampling::fixed_point_bits / weight_of / fixed_weight / top_p_target / draw_position.
__device__ int fixed_point_bits(int64_t V) {
  int lg = 0;
  while ((int64_t{1} << lg) < (V > 1 ? V : 1)) ++lg;
  return 52 < 62 - lg ? 52 : 62 - lg;
}
__device__ __forceinline__ float scaled(float l, float lmax, float T) { return __fdiv_rn(__fsub_rn(l, lmax), T); }
__device__ __forceinline__ float weight(float s) { return __double2float_rn(exp(static_cast<double>(s))); }
__device__ __forceinline__ u64 fixed_weight(float w, double scale) {
  return static_cast<u64>(__dmul_rn(static_cast<double>(w), scale));
}
__device__ u64 top_p_target(float top_p, u64 Z) {
  const double t = ceil(__dmul_rn(static_cast<double>(top_p), static_cast<double>(Z)));
  if (!(t >= 1.0)) return 1;
  if (t >= static_cast<double>(Z)) return Z;
  return static_cast<u64>(t);
}
__device__ u64 draw_position(double u, u64 Z) {
  if (Z == 0) return 0;
  const double r = floor(__dmul_rn(u, static_cast<double>(Z)));
  if (!(r >= 0.0)) return 0;
  if (r >= static_cast<double>(Z)) return Z - 1;
  const u64 p = static_cast<u64>(r);
  return p < Z - 1 ? p : Z - 1;
}

struct ArgMax {
  float v;
  int32_t i;
};
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.v > b.v) return a;
    if (b.v > a.v) return b;
    return a.i <= b.i ? a : b;
  }
};

// hist[bin] += v, aggregated over the active lanes of the warp that share `bin` (256: add nothing).
__device__ __forceinline__ void hist_add(u64* hist, unsigned bin, u64 v) {
  const cg::coalesced_group active = cg::coalesced_threads();
  const cg::coalesced_group same = cg::labeled_partition(active, bin);
  const u64 sum = cg::reduce(same, v, cg::plus<u64>());
  if (same.thread_rank() == 0 && bin < 256 && sum != 0) atomicAdd(&hist[bin], sum);
}

struct MinOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a < b ? a : b; }
};

using ReduceArg = cub::BlockReduce<ArgMax, kThreads>;
using ReduceInt = cub::BlockReduce<int32_t, kThreads>;
using ReduceU64 = cub::BlockReduce<u64, kThreads>;
using ScanU64 = cub::BlockScan<u64, kThreads>;

struct Shared {
  union {
    typename ReduceArg::TempStorage arg;
    typename ReduceInt::TempStorage i32;
    typename ReduceU64::TempStorage u;
    typename ScanU64::TempStorage scan;
  } tmp;
  u64 hist[256];
  u64 sel_acc, total;
  uint32_t sel_prefix;
  int32_t bad, nan_at, arg;
  float lmax;
};

// Radix select from the top over 4 x 8-bit digits of key(i) (UINT32_MAX... from `key`): finds the digit
// path where the running count/mass from the top first reaches `need`. `value(i, &bin_key, &v)` gives
// an element's key and its weight (count 1 or mass; v = 0 / skip handled by the caller via bin 256).
// Returns the selected key; *acc = the weight strictly above it.
template <typename KeyOf>
__device__ uint32_t radix_select(Shared& sh, const float* l, int64_t V, u64 need, KeyOf key_of, u64* acc_out) {
  uint32_t prefix = 0, pmask = 0;
  u64 acc = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      uint32_t k;
      u64 v;
      const bool in = key_of(l[i], &k, &v) && (k & pmask) == prefix;
      hist_add(sh.hist, in ? (k >> shift) & 255u : 256u, in ? v : 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      for (; d > 0; --d) {
        if (acc + sh.hist[d] >= need) break;
        acc += sh.hist[d];
      }
      sh.sel_prefix = prefix | (static_cast<uint32_t>(d) << shift);
      sh.sel_acc = acc;
    }
    __syncthreads();
    prefix = sh.sel_prefix;
    acc = sh.sel_acc;
    pmask |= 255u << shift;
  }
  *acc_out = acc;
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(float* __restrict__ logits, int64_t V, const DeviceRowSampling* __restrict__ rows,
                       const int32_t* __restrict__ ids, DeviceSampleResult* __restrict__ out) {
  __shared__ Shared sh;
  const int tid = threadIdx.x;
  const DeviceRowSampling P = rows[blockIdx.x];
  float* l = logits + static_cast<int64_t>(blockIdx.x) * V;
  auto finish = [&](int32_t token, int32_t status, int32_t at) {
    if (tid == 0) out[blockIdx.x] = DeviceSampleResult{token, status, at, 0};
  };

  // 1. Penalties: every listed id is distinct, so one thread per id needs no atomics.
  if (tid == 0) sh.bad = INT_MAX;
  __syncthreads();
  if (P.repetition_penalty != 1.0f)
    for (int j = tid; j < P.rep_n; j += kThreads) {
      const int32_t t = ids[P.rep_off + j];
      if (t < 0 || t >= V) {
        atomicMin(&sh.bad, j);
        continue;
      }
      const float x = l[t];
      l[t] = x > 0.0f ? __fdiv_rn(x, P.repetition_penalty) : __fmul_rn(x, P.repetition_penalty);
    }
  __syncthreads();
  if (P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f)
    for (int j = tid; j < P.cnt_n; j += kThreads) {
      const int32_t t = ids[P.cnt_off + j];
      if (t < 0 || t >= V) {
        atomicMin(&sh.bad, P.rep_n + j);
        continue;
      }
      const float c = static_cast<float>(ids[P.cnt_off + P.cnt_n + j]);
      l[t] = __fsub_rn(l[t], __fadd_rn(__fmul_rn(P.frequency_penalty, c), P.presence_penalty));
    }
  __syncthreads();
  if (sh.bad != INT_MAX) {
    const int j = sh.bad;
    finish(-1, kBadId, j < P.rep_n ? ids[P.rep_off + j] : ids[P.cnt_off + j - P.rep_n]);
    return;
  }

  // 2. Mask the untokenizable ids; max / argmax (first maximum); the lowest NaN id.
  ArgMax best{kNegInf, INT_MAX};
  int32_t nan_at = INT_MAX;
  for (int64_t i = tid; i < V; i += kThreads) {
    float x = l[i];
    if (i >= P.n_tokenizable) l[i] = x = kNegInf;
    if (isnan(x))
      nan_at = min(nan_at, static_cast<int32_t>(i));
    else if (x > best.v)
      best = ArgMax{x, static_cast<int32_t>(i)};
  }
  const ArgMax bm = ReduceArg(sh.tmp.arg).Reduce(best, ArgMaxOp());
  if (tid == 0) {
    sh.lmax = bm.v;
    sh.arg = bm.i;
  }
  __syncthreads();
  const int32_t nm = ReduceInt(sh.tmp.i32).Reduce(nan_at, MinOp());
  if (tid == 0) sh.nan_at = nm;
  __syncthreads();
  const float lmax = sh.lmax;
  const int32_t arg = sh.arg;
  if (sh.nan_at != INT_MAX) return finish(-1, kNaN, sh.nan_at);
  if (lmax == kNegInf) return finish(-1, kAllMasked, -1);
  if (isinf(lmax)) return finish(-1, kPosInf, arg);
  if (P.temperature == 0.0f) return finish(arg, kOk, -1);

  // 3. Top-k: the k-th largest logit (ties with it are kept).
  const bool top_k = P.top_k > 0 && P.top_k < V;
  float kth = kNegInf;
  if (top_k) {
    u64 above = 0;
    const uint32_t key = radix_select(
        sh, l, V, static_cast<u64>(P.top_k),
        [](float x, uint32_t* k, u64* v) {
          *k = order_key(x);
          *v = 1;
          return true;
        },
        &above);
    kth = from_order_key(key);
  }

  // 4. Weights (the row becomes w) and their fixed-point total.
  const int B = fixed_point_bits(V);
  const double scale = static_cast<double>(1ull << B);
  const float T = P.temperature;
  const float s_floor = __fmul_rn(-static_cast<float>(B + 1), 0.6931472f);
  u64 z = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float x = l[i];
    float w = 0.0f;
    if (x != kNegInf && !(top_k && !(x >= kth))) {
      const float s = scaled(x, lmax, T);
      if (!(s < s_floor)) w = weight(s);
    }
    l[i] = w;
    z += fixed_weight(w, scale);
  }
  const u64 Z1 = ReduceU64(sh.tmp.u).Sum(z);
  if (tid == 0) sh.total = Z1;
  __syncthreads();

  // Each thread's contiguous id range, for the ordered (id-order) scans below.
  const int64_t chunk = (V + kThreads - 1) / kThreads;
  const int64_t b0 = min(V, tid * chunk), b1 = min(V, b0 + chunk);

  // 5. Top-p: threshold key t with mass(w > t) < target <= mass(w >= t); ties at t kept in id order
  //    while the mass before them stays below the target.
  if (P.top_p < 1.0f) {
    const u64 target = top_p_target(P.top_p, sh.total);
    u64 above = 0;
    const uint32_t t = radix_select(
        sh, l, V, target,
        [scale](float w, uint32_t* k, u64* v) {
          *k = __float_as_uint(w);
          *v = fixed_weight(w, scale);
          return w > 0.0f;
        },
        &above);
    u64 tie = 0;
    for (int64_t i = b0; i < b1; ++i) {
      const float w = l[i];
      if (w > 0.0f && __float_as_uint(w) == t) tie += fixed_weight(w, scale);
    }
    u64 ex = 0;
    __syncthreads();  // sh.tmp was last used by the reduce above; radix_select ended with a barrier too
    ScanU64(sh.tmp.scan).ExclusiveSum(tie, ex);
    u64 cum = above + ex;
    for (int64_t i = b0; i < b1; ++i) {
      const float w = l[i];
      const uint32_t k = __float_as_uint(w);
      if (w > 0.0f && k == t) {
        const bool keep = cum < target;
        cum += fixed_weight(w, scale);
        if (!keep) l[i] = 0.0f;
      } else if (k < t) {
        l[i] = 0.0f;
      }
    }
    __syncthreads();
  }

  // 6. Min-p, then the draw in id order.
  auto survivor = [&](float w) -> u64 { return w < P.min_p ? 0 : fixed_weight(w, scale); };
  u64 zm = 0;
  for (int64_t i = b0; i < b1; ++i) zm += survivor(l[i]);
  u64 ex = 0, total = 0;
  __syncthreads();
  ScanU64(sh.tmp.scan).ExclusiveSum(zm, ex, total);
  if (total == 0) return finish(arg, kOk, -1);  // unreachable: the argmax has w = 1
  const u64 pos = draw_position(P.u, total);
  if (ex <= pos && pos < ex + zm) {
    u64 cum = ex;
    for (int64_t i = b0; i < b1; ++i) {
      cum += survivor(l[i]);
      if (cum > pos) {
        out[blockIdx.x] = DeviceSampleResult{static_cast<int32_t>(i), kOk, -1, 0};
        break;
      }
    }
  }
}

}  // namespace

cudaError_t sample_rows(float* logits, int64_t V, const DeviceRowSampling* rows, const int32_t* ids, int R,
                        DeviceSampleResult* out, cudaStream_t stream) {
  if (R <= 0) return cudaSuccess;
  if (V <= 0 || V > INT_MAX) return cudaErrorInvalidValue;
  sample_rows_kernel<<<R, kThreads, 0, stream>>>(logits, V, rows, ids, out);
  return cudaGetLastError();
}

}  // namespace k3::cuda
