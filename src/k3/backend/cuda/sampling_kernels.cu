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
// Top-k and top-p first try a candidate set: pivot statistics from one pass pick the tightest pivot
// that still holds the answer, its candidates (<= 2048) are compacted into shared memory and sorted
// there. Wider sets (flat distributions) take a radix select over the whole row, 4 passes of 8-bit
// digit histograms; those adds are aggregated per warp (lanes with the same bin reduce first, one
// shared atomic per distinct bin), which measured 2x faster than plain shared atomics (logits
// concentrate in a few bins, and the atomics serialise on them).
#include "k3/backend/cuda/sampling_kernels.h"

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <climits>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include "k3/backend/cuda/pdl.cuh"

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

// Calls f(i, x) for this thread's share of the row in increasing id order: ids 4j..4j+3 for
// j = tid, tid + kThreads, ... with four float4 loads in flight (a row pass is latency-bound with one
// block per row), or plain strided ids when the row is not float4-aligned (V % 4 != 0).
template <typename F>
__device__ __forceinline__ void visit(const float* l, int64_t V, bool vec, F&& f) {
  if (vec) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    const int64_t n4 = V >> 2;
    int64_t j = threadIdx.x;
    for (; j + 3 * kThreads < n4; j += 4 * kThreads) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = l4[j + u * kThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = 4 * (j + u * kThreads);
        f(i, v[u].x), f(i + 1, v[u].y), f(i + 2, v[u].z), f(i + 3, v[u].w);
      }
    }
    for (; j < n4; j += kThreads) {
      const float4 v = l4[j];
      f(4 * j, v.x), f(4 * j + 1, v.y), f(4 * j + 2, v.z), f(4 * j + 3, v.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) f(i, l[i]);
  }
}

// The same over a contiguous id range [b0, b1) (b0, b1 multiples of 4 when vec).
template <typename F>
__device__ __forceinline__ void visit_range(const float* l, int64_t b0, int64_t b1, bool vec, F&& f) {
  if (vec) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    int64_t i = b0;
    for (; i + 16 <= b1; i += 16) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = l4[(i >> 2) + u];
#pragma unroll
      for (int u = 0; u < 4; ++u) f(i + 4 * u, v[u].x), f(i + 4 * u + 1, v[u].y), f(i + 4 * u + 2, v[u].z), f(i + 4 * u + 3, v[u].w);
    }
    for (; i < b1; i += 4) {
      const float4 v = l4[i >> 2];
      f(i, v.x), f(i + 1, v.y), f(i + 2, v.z), f(i + 3, v.w);
    }
  } else {
    for (int64_t i = b0; i < b1; ++i) f(i, l[i]);
  }
}

using ReduceArg = cub::BlockReduce<ArgMax, kThreads>;
using ReduceInt = cub::BlockReduce<int32_t, kThreads>;
using ReduceU64 = cub::BlockReduce<u64, kThreads>;
using ScanU64 = cub::BlockScan<u64, kThreads>;

// Candidate selection (the fast path of top-k and top-p): one pass counts (and for top-p weighs) the
// elements above each of kPivots fixed pivots; the tightest pivot that still holds the answer gives
// a candidate set, which is compacted into shared memory when it has at most kCandCap elements and
// sorted there (key = (value desc, id asc) in one u64). Larger sets take the radix-select path.
constexpr int kCandPerThread = 2, kCandCap = kThreads * kCandPerThread, kPivots = 8;
// Pivot distances below the maximum: logit - lmax >= -d (top-k), w >= exp(-d) (top-p).
__constant__ float kPivotD[kPivots] = {0.5f, 1.f, 2.f, 3.f, 4.f, 6.f, 9.f, 16.f};

struct PivotStats {
  u64 mass[kPivots];
  uint32_t count[kPivots];
};
struct PivotSum {
  __device__ PivotStats operator()(const PivotStats& a, const PivotStats& b) const {
    PivotStats r;
#pragma unroll
    for (int j = 0; j < kPivots; ++j) r.mass[j] = a.mass[j] + b.mass[j], r.count[j] = a.count[j] + b.count[j];
    return r;
  }
};
using ReducePivots = cub::BlockReduce<PivotStats, kThreads>;
using SortU64 = cub::BlockRadixSort<u64, kThreads, kCandPerThread>;

struct Shared {
  union {
    typename ReduceArg::TempStorage arg;
    typename ReduceInt::TempStorage i32;
    typename ReduceU64::TempStorage u;
    typename ScanU64::TempStorage scan;
    typename ReducePivots::TempStorage piv;
    typename SortU64::TempStorage sort;
    u64 cand[kCandCap];
  } tmp;
  u64 hist[256];
  PivotStats stats;
  u64 sel_acc, total;
  uint32_t sel_prefix, n_cand;
  int32_t bad, nan_at, arg, t_id;
  float lmax, kth, t_w;
};

// Searches a threshold thr with weight(score >= thr) >= need and count(score >= thr) <= kCandCap, as
// tight as the pivots allow: pivots at distances d below `top` (thr = top - d for logits, exp(-d) for
// weights), first the fixed ladder kPivotD, then up to two rounds of kPivots pivots evenly inside the
// bracket (last pivot short of `need`, first one reaching it but holding too many). score_of(i, x)
// gives an element's score (-inf: none); with kMass the weight is fixed_weight(score), else 1.
// Returns false when no pivot works (the caller takes the radix path).
template <bool kMass, typename ScoreOf>
__device__ bool find_threshold(Shared& sh, const float* l, int64_t V, bool vec, float top, u64 need, double scale,
                               ScoreOf score_of, float* thr_out) {
  float d[kPivots], thr[kPivots];
#pragma unroll
  for (int j = 0; j < kPivots; ++j) d[j] = kPivotD[j];
  float hi = 0.0f;  // the current bracket's upper end (a distance that reaches `need` with too many)
  for (int round = 0; round < 3; ++round) {
#pragma unroll
    for (int j = 0; j < kPivots; ++j) thr[j] = kMass ? expf(-d[j]) : top - d[j];
    PivotStats st{};
    visit(l, V, vec, [&](int64_t i, float x) {
      const float sc = score_of(i, x);
      const u64 W = kMass ? fixed_weight(sc, scale) : 0;
#pragma unroll
      for (int j = 0; j < kPivots; ++j) {
        const bool above = sc >= thr[j];
        if (kMass) st.mass[j] += above ? W : 0;
        st.count[j] += above;
      }
    });
    st = ReducePivots(sh.tmp.piv).Reduce(st, PivotSum());
    if (threadIdx.x == 0) sh.stats = st;
    __syncthreads();
    int jsel = -1;
    for (int j = 0; j < kPivots && jsel < 0; ++j)
      if ((kMass ? sh.stats.mass[j] : sh.stats.count[j]) >= need) jsel = j;
    const uint32_t cnt = jsel >= 0 ? sh.stats.count[jsel] : 0;
    __syncthreads();  // sh.stats is rewritten by the next round
    if (jsel >= 0 && cnt <= kCandCap) {
      *thr_out = thr[jsel];
      return true;
    }
    // Bracket for the next round: (lo, hi) with lo short of `need`, hi reaching it with too many.
    float lo;
    if (jsel < 0) {
      if (round == 0) return false;  // even the widest pivot is short: the radix path
      lo = d[kPivots - 1];           // between this round's last pivot and the bracket's top
    } else {
      lo = jsel > 0 ? d[jsel - 1] : 0.0f;
      hi = d[jsel];
    }
#pragma unroll
    for (int j = 0; j < kPivots; ++j) d[j] = lo + (hi - lo) * static_cast<float>(j + 1) / static_cast<float>(kPivots + 1);
  }
  return false;
}

// Gathers the keys of the elements with pred(i, x) into sh.tmp.cand (the caller checked that they fit)
// and sorts them ascending into this thread's keys[] (blocked: positions kCandPerThread * tid + u);
// unused positions hold UINT64_MAX. Warp-aggregated slot allocation: one shared atomic per warp.
template <typename Pred, typename KeyFn>
__device__ void gather_sorted(Shared& sh, const float* l, int64_t V, bool vec, Pred pred, KeyFn key_fn,
                              u64 (&keys)[kCandPerThread]) {
  if (threadIdx.x == 0) sh.n_cand = 0;
  __syncthreads();
  visit(l, V, vec, [&](int64_t i, float x) {
    if (!pred(i, x)) return;
    const cg::coalesced_group g = cg::coalesced_threads();
    uint32_t base = 0;
    if (g.thread_rank() == 0) base = atomicAdd(&sh.n_cand, g.size());
    const uint32_t slot = g.shfl(base, 0) + g.thread_rank();
    if (slot < kCandCap) sh.tmp.cand[slot] = key_fn(i, x);
  });
  __syncthreads();
  const uint32_t n = sh.n_cand;
#pragma unroll
  for (int u = 0; u < kCandPerThread; ++u) {
    const uint32_t p = threadIdx.x * kCandPerThread + u;
    keys[u] = p < n ? sh.tmp.cand[p] : ~0ull;
  }
  __syncthreads();  // the sort's temp storage overlays the candidates
  SortU64(sh.tmp.sort).Sort(keys);
  __syncthreads();
}

// Radix select from the top over 4 x 8-bit digits of the elements' keys: the largest key t whose
// running weight from the top (weight of keys >= t) reaches `need`. key_of(i, x, &key, &weight) gives
// an element's key and weight (1 to count, its fixed-point mass for top-p) and false to leave it out.
// Returns t; *acc_out = the weight of the keys strictly above t.
template <typename KeyOf>
__device__ uint32_t radix_select(Shared& sh, const float* l, int64_t V, bool vec, u64 need, KeyOf key_of, u64* acc_out) {
  uint32_t prefix = 0, pmask = 0;
  u64 acc = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    visit(l, V, vec, [&](int64_t i, float x) {
      uint32_t k;
      u64 v;
      if (key_of(i, x, &k, &v) && (k & pmask) == prefix) hist_add(sh.hist, (k >> shift) & 255u, v);
    });
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
    sample_rows_kernel(float* logits, int64_t V, const DeviceRowSampling* __restrict__ rows,
                       const int32_t* __restrict__ ids, DeviceSampleResult* __restrict__ out) {
  pdl::begin();  // pdl-launched (pdl.cuh): nothing read before the predecessor completes
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
  const bool vec = (V & 3) == 0;  // rows start 16-byte aligned
  const int64_t ntok = P.n_tokenizable;
  ArgMax best{kNegInf, INT_MAX};
  int32_t nan_at = INT_MAX;
  visit(l, V, vec, [&](int64_t i, float x) {
    if (i >= ntok) x = kNegInf;  // masked on every read until the weights pass rewrites the row
    if (isnan(x))
      nan_at = min(nan_at, static_cast<int32_t>(i));
    else if (x > best.v)
      best = ArgMax{x, static_cast<int32_t>(i)};
  });
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
    const u64 k = static_cast<u64>(P.top_k);
    float piv = 0.0f;
    if (find_threshold<false>(sh, l, V, vec, lmax, k, 0.0, [ntok](int64_t i, float x) { return i >= ntok ? kNegInf : x; },
                              &piv)) {
      u64 keys[kCandPerThread];
      gather_sorted(
          sh, l, V, vec, [&](int64_t i, float x) { return i < ntok && x >= piv; },
          [](int64_t i, float x) { return (static_cast<u64>(~order_key(x)) << 32) | static_cast<uint32_t>(i); }, keys);
#pragma unroll
      for (int u = 0; u < kCandPerThread; ++u)
        if (static_cast<u64>(tid) * kCandPerThread + u == k - 1) sh.kth = from_order_key(~static_cast<uint32_t>(keys[u] >> 32));
      __syncthreads();
      kth = sh.kth;
    } else {
      u64 above = 0;
      const uint32_t key = radix_select(
          sh, l, V, vec, k,
          [ntok](int64_t i, float x, uint32_t* kk, u64* v) {
            *kk = order_key(i >= ntok ? kNegInf : x);
            *v = 1;
            return true;
          },
          &above);
      kth = from_order_key(key);
    }
  }

  // 4. Weights (the row becomes w) and their fixed-point total.
  const int B = fixed_point_bits(V);
  const double scale = static_cast<double>(1ull << B);
  const float T = P.temperature;
  const float s_floor = __fmul_rn(-static_cast<float>(B + 1), 0.6931472f);
  const bool top_p = P.top_p < 1.0f;
  u64 z = 0;
  auto weigh = [&](int64_t i, float x) {
    float w = 0.0f;
    if (i < ntok && x != kNegInf && !(top_k && !(x >= kth))) {
      const float s = scaled(x, lmax, T);
      if (!(s < s_floor)) w = weight(s);
    }
    z += fixed_weight(w, scale);
    return w;
  };
  if (vec) {
    float4* l4 = reinterpret_cast<float4*>(l);
    for (int64_t j = tid; j < (V >> 2); j += kThreads) {
      float4 v = l4[j];
      v.x = weigh(4 * j, v.x), v.y = weigh(4 * j + 1, v.y), v.z = weigh(4 * j + 2, v.z), v.w = weigh(4 * j + 3, v.w);
      l4[j] = v;
    }
  } else {
    for (int64_t i = tid; i < V; i += kThreads) l[i] = weigh(i, l[i]);
  }
  const u64 Z1 = ReduceU64(sh.tmp.u).Sum(z);
  if (tid == 0) sh.total = Z1;
  __syncthreads();
  if (tid == 0) sh.t_w = -1.0f;  // the top-p bound (w, id): every w passes until top-p sets it
  __syncthreads();

  // Each thread's contiguous id range, for the ordered (id-order) scans below.
  const int64_t chunk = ((V + kThreads - 1) / kThreads + 3) / 4 * 4;
  const int64_t b0 = min(V, tid * chunk), b1 = min(V, b0 + chunk);

  // 5. Top-p: threshold key t with mass(w > t) < target <= mass(w >= t); ties at t kept in id order
  //    while the mass before them stays below the target.
  if (top_p) {
    const u64 target = top_p_target(P.top_p, sh.total);
    float c = 0.0f;
    if (find_threshold<true>(sh, l, V, vec, 1.0f, target, scale, [](int64_t, float w) { return w > 0.0f ? w : kNegInf; },
                             &c)) {
      // Candidates w >= c: every kept id is one (an id below c has all of c's mass before it). In
      // (w desc, id asc) order the kept ids are the prefix whose exclusive mass is below the target;
      // the last one, (t_w, t_id), bounds the survivors of step 6.
      u64 keys[kCandPerThread], W[kCandPerThread], ex[kCandPerThread];
      gather_sorted(
          sh, l, V, vec, [&](int64_t, float w) { return w > 0.0f && w >= c; },
          [](int64_t i, float w) { return (static_cast<u64>(~__float_as_uint(w)) << 32) | static_cast<uint32_t>(i); }, keys);
#pragma unroll
      for (int u = 0; u < kCandPerThread; ++u)
        W[u] = keys[u] == ~0ull ? 0 : fixed_weight(__uint_as_float(~static_cast<uint32_t>(keys[u] >> 32)), scale);
      ScanU64(sh.tmp.scan).ExclusiveSum(W, ex);
#pragma unroll
      for (int u = 0; u < kCandPerThread; ++u)
        if (keys[u] != ~0ull && ex[u] < target && ex[u] + W[u] >= target) {
          sh.t_w = __uint_as_float(~static_cast<uint32_t>(keys[u] >> 32));
          sh.t_id = static_cast<int32_t>(keys[u] & 0xffffffffu);
        }
      __syncthreads();
    } else {
      u64 above = 0;
      const uint32_t t = radix_select(
          sh, l, V, vec, target,
          [scale](int64_t, float w, uint32_t* k, u64* v) {
            *k = __float_as_uint(w);
            *v = fixed_weight(w, scale);
            return w > 0.0f;
          },
          &above);
      u64 tie = 0;
      visit_range(l, b0, b1, vec, [&](int64_t, float w) {
        if (w > 0.0f && __float_as_uint(w) == t) tie += fixed_weight(w, scale);
      });
      u64 ex = 0;
      __syncthreads();  // sh.tmp was last used by the reduce above; radix_select ended with a barrier too
      ScanU64(sh.tmp.scan).ExclusiveSum(tie, ex);
      u64 cum = above + ex;
      visit_range(l, b0, b1, vec, [&](int64_t i, float w) {
        const uint32_t k = __float_as_uint(w);
        if (w > 0.0f && k == t) {
          const bool keep = cum < target;
          cum += fixed_weight(w, scale);
          if (!keep) l[i] = 0.0f;
        } else if (k < t && w != 0.0f) {
          l[i] = 0.0f;
        }
      });
      __syncthreads();
    }
  }

  // 6. Min-p, then the draw in id order.
  const float t_w = sh.t_w;
  const int32_t t_id = sh.t_id;
  auto survivor = [&](int64_t i, float w) -> u64 {
    const bool in_top_p = w > t_w || (w == t_w && i <= t_id);
    return !in_top_p || w < P.min_p ? 0 : fixed_weight(w, scale);
  };
  u64 zm = 0;
  visit_range(l, b0, b1, vec, [&](int64_t i, float w) { zm += survivor(i, w); });
  u64 ex = 0, total = 0;
  __syncthreads();
  ScanU64(sh.tmp.scan).ExclusiveSum(zm, ex, total);
  if (total == 0) return finish(arg, kOk, -1);  // unreachable: the argmax has w = 1
  const u64 pos = draw_position(P.u, total);
  if (ex <= pos && pos < ex + zm) {
    u64 cum = ex;
    int64_t token = -1;
    visit_range(l, b0, b1, vec, [&](int64_t i, float w) {
      if (token >= 0) return;
      cum += survivor(i, w);
      if (cum > pos) token = i;
    });
    out[blockIdx.x] = DeviceSampleResult{static_cast<int32_t>(token), kOk, -1, 0};
  }
}

// One block per row: the bias pairs first (distinct ids: no atomics), then -inf for every id the mask
// does not allow (-inf + bias stays -inf, so the order only matters within a thread's own writes).
__global__ void __launch_bounds__(kThreads)
    constrain_rows_kernel(float* logits, int64_t V, const DeviceRowConstraint* __restrict__ rows,
                          const int32_t* __restrict__ bias_ids, const float* __restrict__ bias_values,
                          const uint32_t* __restrict__ mask) {
  pdl::begin();  // pdl-launched (pdl.cuh): nothing read before the predecessor completes
  const DeviceRowConstraint P = rows[blockIdx.x];
  float* l = logits + static_cast<int64_t>(blockIdx.x) * V;
  for (int j = threadIdx.x; j < P.bias_n; j += kThreads) {
    const int32_t t = bias_ids[P.bias_off + j];
    if (t >= 0 && t < V) l[t] = __fadd_rn(l[t], bias_values[P.bias_off + j]);
  }
  if (P.mask_words <= 0) return;
  __syncthreads();
  const uint32_t* words = mask + P.mask_off;
  const int64_t covered = static_cast<int64_t>(P.mask_words) * 32;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const bool ok = i < covered && ((words[i >> 5] >> (i & 31)) & 1u);
    if (!ok) l[i] = kNegInf;
  }
}

}  // namespace

cudaError_t constrain_rows(float* logits, int64_t V, const DeviceRowConstraint* rows, const int32_t* bias_ids,
                           const float* bias_values, const uint32_t* mask, int R, cudaStream_t stream) {
  if (R <= 0) return cudaSuccess;
  if (V <= 0 || V > INT_MAX) return cudaErrorInvalidValue;
  (void)pdl::launch(constrain_rows_kernel, R, kThreads, 0, stream, logits, V, rows, bias_ids, bias_values, mask);
  return cudaGetLastError();
}

cudaError_t sample_rows(float* logits, int64_t V, const DeviceRowSampling* rows, const int32_t* ids, int R,
                        DeviceSampleResult* out, cudaStream_t stream) {
  if (R <= 0) return cudaSuccess;
  if (V <= 0 || V > INT_MAX) return cudaErrorInvalidValue;
  (void)pdl::launch(sample_rows_kernel, R, kThreads, 0, stream, logits, V, rows, ids, out);
  return cudaGetLastError();
}

}  // namespace k3::cuda
