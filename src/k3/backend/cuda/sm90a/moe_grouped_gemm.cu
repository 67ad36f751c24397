// Routed experts at prefill sizes on CUTLASS's sm_90a grouped GEMM: moe_grouped_gemm.h.
//
// The kernel: CUTLASS 4.2's pointer-array grouped GEMM (KernelPtrArrayTmaWarpSpecializedPingpong): a producer warp
// loads each operand tile (64 columns of k) with TMA (its tensor maps rewritten in the kernel when the group changes),
// two consumer warpgroups take turns on 128- or 64-row x 128 output tiles (one's wgmmas under the other's epilogue), and a
// persistent scheduler walks every group's tiles. The problem shapes and pointers are device arrays written by a
// small kernel from the plan's expert offsets, so no count comes back to the host and the launch's arguments never
// change: each CUTLASS object is initialised once (its tensor-map templates and workspace) and only launched after.
// Operands: A = the gathered activations [rows][k] (bf16, row-major), B = an expert's matrix [N][k] as stored (bf16,
// row-major: the "column-major B" of a TN GEMM), D = fp32 [rows][N] row-major; the lo halves' pass accumulates
// (C = D, beta 1).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_slots.cuh"
#include "k3/backend/cuda/moe_grouped_gemm.h"
#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/backend/cuda/moe_tc_tile.cuh"

namespace k3::cuda::moe_cutlass {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) a group
using ElementAB = cutlass::bfloat16_t;
using ElementCD = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutCD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 8;  // elements of 16 bytes: TMA's row alignment (the outputs': Kernel::kAlignOut)
using ClusterShape = Shape<_1, _1, _1>;

// One tile shape's kernel. TILE_M: rows (pairs) of an output tile, 128 or 64 (moe_grouped_gemm.h tile_m: the rule
// measured in call s57-1 -- 64 up to 96 pairs an expert, where the 128-row tiles are mostly padding), pingpong; or 256
// with both consumer warpgroups on one tile (cooperative): Bf16x2's merged groups (an expert's hi and lo rows, ~2 x 128
// at pp4096 on Kimi-Linear) in one tile, so each weight tile is loaded once for both halves.
// OUT: the output element, fp32 or (Bf16 precision's set kernels, OutBf16) bf16 rounded in the epilogue.
template <int TILE_M, class KS = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
          class ES = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong, class OUT = ElementCD>
struct Kernel {
  using KernelSchedule = KS;
  using EpilogueSchedule = ES;
  using TileShape = Shape<Int<TILE_M>, _128, _64>;
  static constexpr int kAlignOut = 16 / static_cast<int>(sizeof(OUT));
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, OUT, LayoutCD*, kAlignOut, OUT, LayoutCD*,
      kAlignOut, EpilogueSchedule, cutlass::epilogue::fusion::LinearCombination<OUT, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignAB, ElementAB, LayoutB*, kAlignAB,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};
using Gemm128 = Kernel<128>::Gemm;
using Gemm64 = Kernel<64>::Gemm;
using Gemm256 = Kernel<256, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                       cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::Gemm;
using OutBf16 = cutlass::bfloat16_t;
using Gemm128h = Kernel<128, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                        cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong, OutBf16>::Gemm;
using Gemm64h = Kernel<64, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                       cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong, OutBf16>::Gemm;
using StrideA = typename Gemm128::GemmKernel::InternalStrideA;
using StrideB = typename Gemm128::GemmKernel::InternalStrideB;
using StrideC = typename Gemm128::GemmKernel::InternalStrideC;
using StrideD = typename Gemm128::GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;
static_assert(std::is_same_v<StrideA, typename Gemm64::GemmKernel::InternalStrideA> &&
                  std::is_same_v<StrideC, typename Gemm64::GemmKernel::InternalStrideC> &&
                  std::is_same_v<StrideA, typename Gemm256::GemmKernel::InternalStrideA> &&
                  std::is_same_v<StrideC, typename Gemm256::GemmKernel::InternalStrideC> &&
                  std::is_same_v<StrideC, typename Gemm128h::GemmKernel::InternalStrideC> &&
                  std::is_same_v<StrideD, typename Gemm64h::GemmKernel::InternalStrideD>,
              "every tile shape reads the same arrays");
// Row-major rows of unit stride along k (A, B) or N (C, D); the batch mode unused: only mode 0 is set at run time.
static_assert(std::is_same_v<StrideA, Stride<int64_t, _1, _0>>, "A: row-major rows of k");
static_assert(std::is_same_v<StrideB, Stride<int64_t, _1, _0>>, "B: an expert's [N][k] as stored");
static_assert(std::is_same_v<StrideC, Stride<int64_t, _1, _0>> && std::is_same_v<StrideD, StrideC>, "C, D: row-major");

// The device arrays of one grouped launch (up to `groups` GEMMs) and its CUTLASS objects, all bound to the same arrays:
// for each tile shape, beta 0 (D = A B) and beta 1 (D += A B, the lo halves' pass).
struct Grouped {
  int groups = 0;
  void* mem = nullptr;  // one allocation: the arrays, then the four objects' workspaces
  Shape3* shapes = nullptr;
  const ElementAB** a = nullptr;
  const ElementAB** b = nullptr;
  ElementCD** d = nullptr;
  StrideA* sa = nullptr;
  StrideB* sb = nullptr;
  StrideC* sc = nullptr;
  StrideD* sd = nullptr;
  Gemm128 set128, add128;
  Gemm64 set64, add64;
  Gemm256 set256;  // made only for merged groups (make_grouped's tall)
  Gemm128h set128h;  // bf16 outputs (Bf16 precision): made for the others
  Gemm64h set64h;
};

size_t round256(size_t b) { return (b + 255) & ~static_cast<size_t>(255); }

// Arguments for g's GEMMs (the arrays' contents are written per launch by fill_groups).
template <class Gemm>
typename Gemm::Arguments arguments(Grouped& g, bool accumulate, int sm_count, int device) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sm_count;
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.0f;
  fusion.beta = accumulate ? 1.0f : 0.0f;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {_0{}, _0{}, 0};
  fusion.dBeta = {_0{}, _0{}, 0};
  // The output pointer array holds fp32 or bf16 addresses (fill_groups' out_bytes); each object reads it as its type.
  using Out = typename Gemm::GemmKernel::CollectiveEpilogue::ElementD;
  Out** d = reinterpret_cast<Out**>(g.d);
  args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {g.groups, g.shapes, nullptr},
                                  {g.a, g.sa, g.b, g.sb},
                                  {fusion, accumulate ? const_cast<const Out**>(d) : nullptr, g.sc, d, g.sd},
                                  hw};
  return args;
}

template <class Gemm>
cudaError_t init_gemm(Gemm& gemm, Grouped& g, bool accumulate, void* workspace, int sm_count, int device) {
  typename Gemm::Arguments args = arguments<Gemm>(g, accumulate, sm_count, device);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(args, workspace) != cutlass::Status::kSuccess) return cudaErrorInvalidConfiguration;
  return cudaSuccess;
}

// Allocates g's arrays for `groups` GEMMs of width N over k (row-major strides, the same for every group) and
// initialises its objects: the fp32 set / add pairs at 128 and 64 rows, then the 256-row set for merged groups (tall)
// or the bf16-output sets (the others). cudaError on failure.
cudaError_t make_grouped(Grouped& g, int groups, int N, int k, int device, int sm_count, bool tall = false) {
  g.groups = groups;
  const size_t G = static_cast<size_t>(groups);
  const size_t b_shapes = round256(G * sizeof(Shape3)), b_ptr = round256(G * sizeof(void*));
  const size_t b_sa = round256(G * sizeof(StrideA)), b_sb = round256(G * sizeof(StrideB));
  const size_t b_sc = round256(G * sizeof(StrideC)), b_sd = round256(G * sizeof(StrideD));
  // workspace sizes: independent of the arrays' contents
  const size_t b_ws = round256(std::max({Gemm128::get_workspace_size(arguments<Gemm128>(g, false, sm_count, device)),
                                         Gemm64::get_workspace_size(arguments<Gemm64>(g, false, sm_count, device)),
                                         Gemm256::get_workspace_size(arguments<Gemm256>(g, false, sm_count, device)),
                                         Gemm128h::get_workspace_size(arguments<Gemm128h>(g, false, sm_count, device)),
                                         Gemm64h::get_workspace_size(arguments<Gemm64h>(g, false, sm_count, device))}));
  const size_t bytes = b_shapes + 3 * b_ptr + b_sa + b_sb + b_sc + b_sd + 7 * b_ws;
  cudaError_t e = cudaMalloc(&g.mem, bytes);
  if (e != cudaSuccess) {
    g.mem = nullptr;
    return e;
  }
  char* p = static_cast<char*>(g.mem);
  g.shapes = reinterpret_cast<Shape3*>(p);
  p += b_shapes;
  g.a = reinterpret_cast<const ElementAB**>(p);
  p += b_ptr;
  g.b = reinterpret_cast<const ElementAB**>(p);
  p += b_ptr;
  g.d = reinterpret_cast<ElementCD**>(p);
  p += b_ptr;
  g.sa = reinterpret_cast<StrideA*>(p);
  p += b_sa;
  g.sb = reinterpret_cast<StrideB*>(p);
  p += b_sb;
  g.sc = reinterpret_cast<StrideC*>(p);
  p += b_sc;
  g.sd = reinterpret_cast<StrideD*>(p);
  p += b_sd;
  void* ws[7] = {p, p + b_ws, p + 2 * b_ws, p + 3 * b_ws, p + 4 * b_ws, p + 5 * b_ws, p + 6 * b_ws};
  // Row-major strides: only the row length matters (M = 1 stands in; the batch mode is unused).
  {
    std::unique_ptr<StrideA[]> sa(new StrideA[G]);
    std::unique_ptr<StrideB[]> sb(new StrideB[G]);
    std::unique_ptr<StrideC[]> sc(new StrideC[G]);
    for (size_t i = 0; i < G; ++i) {
      sa[i] = StrideA{};
      sb[i] = StrideB{};
      sc[i] = StrideC{};
      get<0>(sa[i]) = k;  // A [rows][k], B [N][k], C / D [rows][N]: the leading stride is the row length
      get<0>(sb[i]) = k;
      get<0>(sc[i]) = N;
    }
    e = cudaMemcpy(g.sa, sa.get(), G * sizeof(StrideA), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(g.sb, sb.get(), G * sizeof(StrideB), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(g.sc, sc.get(), G * sizeof(StrideC), cudaMemcpyHostToDevice);
    static_assert(sizeof(StrideC) == sizeof(StrideD), "C and D strides alike");
    if (e == cudaSuccess) e = cudaMemcpy(g.sd, sc.get(), G * sizeof(StrideD), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return e;
  }
  if ((e = init_gemm(g.set128, g, false, ws[0], sm_count, device)) != cudaSuccess) return e;
  if ((e = init_gemm(g.add128, g, true, ws[1], sm_count, device)) != cudaSuccess) return e;
  if ((e = init_gemm(g.set64, g, false, ws[2], sm_count, device)) != cudaSuccess) return e;
  if ((e = init_gemm(g.add64, g, true, ws[3], sm_count, device)) != cudaSuccess) return e;
  if (tall) return init_gemm(g.set256, g, false, ws[4], sm_count, device);
  if ((e = init_gemm(g.set128h, g, false, ws[5], sm_count, device)) != cudaSuccess) return e;
  return init_gemm(g.set64h, g, false, ws[6], sm_count, device);
}

// The groups of one launch: expert e and matrix m (w0 -> d0, or w1 -> d1 when there are two) is group g = e mats + m.
// Rows of expert e: [off[e], off[e + 1]) -- with `merged` (Bf16x2's one-launch form) [2 off[e], 2 off[e + 1]): its
// hi rows then its lo rows (merged_row); w_m + e N k its matrix; outputs row-major, N a row.
// out_bytes: 4 (fp32 outputs) or 2 (bf16: the Bf16 precision's outputs) -- d0 / d1 then hold bf16 rows.
__global__ void fill_groups(int E, int N, int k, bool merged, const int32_t* __restrict__ off, const uint16_t* a,
                            const uint16_t* w0, float* d0, const uint16_t* w1, float* d1, Shape3* shapes,
                            const ElementAB** pa, const ElementAB** pb, ElementCD** pd, int out_bytes = 4) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const int mats = w1 ? 2 : 1;
  if (g >= E * mats) return;
  const int m = g % mats, e = g / mats, mul = merged ? 2 : 1;
  const int64_t r0 = static_cast<int64_t>(mul) * off[e];
  const int rows = mul * (off[e + 1] - off[e]);
  shapes[g] = make_shape(rows, N, k);
  pa[g] = reinterpret_cast<const ElementAB*>(a + r0 * k);
  pb[g] = reinterpret_cast<const ElementAB*>((m ? w1 : w0) + static_cast<int64_t>(e) * N * k);
  pd[g] = reinterpret_cast<float*>(reinterpret_cast<char*>(m ? d1 : d0) + r0 * N * out_bytes);
}

// Bf16x2's merged rows: slot s of expert e (off[e] <= s < off[e + 1]) has its hi half at row s + off[e] and its lo
// half at s + off[e + 1] -- expert e's 2 m rows contiguous, hi then lo, so that one 256-row tile holds both halves of
// up to 128 pairs and loads each weight tile once for them.
// Slot s's rows: s itself (both halves' buffers), or its merged hi and lo rows.
struct SlotRows {
  int64_t hi, lo;
};
__device__ __forceinline__ SlotRows slot_rows(const int32_t* __restrict__ off, int E, int s, bool merged) {
  if (!merged) return {s, s};
  const int e = moe_dev::expert_of_slot(off, E, s);
  return {s + off[e], s + off[e + 1]};
}

// Slot s < off[E]: x's row of its token (sorted[s] / K) as bf16 into hi[s] (and its residual into lo[s]: the tiles'
// split, moe_tc_tile.cuh bf16x2_rn); rows of X, X % 8 == 0.
// merged: hi and lo both in `hi`, at the merged rows (lo unused).
__global__ void gather_rows(int K, int X, int E, const int32_t* __restrict__ off, const int32_t* __restrict__ sorted,
                            const float* __restrict__ x, __nv_bfloat16* hi, __nv_bfloat16* lo, bool merged) {
  const int s = blockIdx.x;
  if (s >= off[E]) return;
  const float4* src = reinterpret_cast<const float4*>(x + static_cast<int64_t>(sorted[s] / K) * X);
  const SlotRows r = slot_rows(off, E, s, merged);
  if (merged) lo = hi;
  uint2* h4 = reinterpret_cast<uint2*>(hi + r.hi * X);
  uint2* l4 = lo ? reinterpret_cast<uint2*>(lo + r.lo * X) : nullptr;
  for (int i = threadIdx.x; i < X / 4; i += blockDim.x) {
    const float4 v = __ldg(src + i);
    float r0, r1, r2, r3;
    h4[i] = make_uint2(bf16x2_rn(v.x, v.y, r0, r1), bf16x2_rn(v.z, v.w, r2, r3));
    if (l4) l4[i] = make_uint2(bf16x2_rn(r0, r1), bf16x2_rn(r2, r3));
  }
}

// h = glu(gate, up) for slot s < off[E], column pairs j < I (I % 8 == 0), rounded to bf16 (hi, and lo as gather_rows).
// merged (Bf16x2's one-launch form): gate and up are the sums of the hi and lo rows' products -- the fp32 sum the
// two-launch form's accumulating epilogue formed, the same bits --, and h's halves go to the merged rows of `hi`.
// T: the gate / up outputs' type (float; bf16 from the Bf16 precision's bf16-output GEMMs).
__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__global__ void glu_rows(int E, int I, const int32_t* __restrict__ off, const T* __restrict__ gate,
                         const T* __restrict__ up, bool merged, GluAct act, float beta, float lbeta,
                         __nv_bfloat16* hi, __nv_bfloat16* lo) {
  const int s = blockIdx.x;
  if (s >= off[E]) return;
  const SlotRows r = slot_rows(off, E, s, merged);
  if (merged) lo = hi;
  const int64_t base = r.hi * I, lo_off = (r.lo - r.hi) * I;
  uint32_t* h2 = reinterpret_cast<uint32_t*>(hi + base);
  uint32_t* l2 = lo ? reinterpret_cast<uint32_t*>(lo + r.lo * I) : nullptr;
  auto at = [&](const T* p, int64_t k) { return merged ? as_float(p[k]) + as_float(p[k + lo_off]) : as_float(p[k]); };
  for (int j = threadIdx.x; j < I / 2; j += blockDim.x) {
    const int64_t k = base + 2 * j;
    const float a = moe_dev::glu(at(gate, k), at(up, k), act, beta, lbeta),
                b = moe_dev::glu(at(gate, k + 1), at(up, k + 1), act, beta, lbeta);
    float ra, rb;
    h2[j] = bf16x2_rn(a, b, ra, rb);
    if (l2) l2[j] = bf16x2_rn(ra, rb);
  }
}

}  // namespace

class Scratch {
 public:
  int max_pairs = 0, E = 0, I = 0, X = 0, device = -1;
  __nv_bfloat16* act = nullptr;  // [2][max_pairs][X]: x's hi / lo rows, then h's hi / lo rows ([P][I] each)
  Grouped gate_up, down;  // one launch for one half (Bf16; Bf16x2's two-launch form): 2 E and E groups
  // Bf16x2's one-launch form: the merged groups (2 E, E; 256-row tiles) and their fp32 outputs, made on first use:
  // gate and up as [2 max_pairs][I] each (merged rows), then down's as [2 max_pairs][X].
  Grouped gate_up2, down2;
  float* d2 = nullptr;
  ~Scratch() {
    cudaFree(act);
    cudaFree(gate_up.mem);
    cudaFree(down.mem);
    cudaFree(gate_up2.mem);
    cudaFree(down2.mem);
    cudaFree(d2);
  }
};

void ScratchDeleter::operator()(Scratch* s) const { delete s; }

bool supports(const ExpertBank& w) {  // moe_wg::supports: a compute-capability-9.0 device, BF16 widths of 8
  return w.format == WeightFormat::BF16 && w.I <= w.X && w.E > 0 && moe_wg::supports(w);
}

namespace {
int tile_arg(int m) { return m == 64 || m == 128 ? m : 0; }
std::atomic<int> g_tile_m{[] {  // "64" or "128" exactly, anything else the rule (no numeric parse of the environment)
  const char* v = std::getenv("K3_MOE_CUTLASS_TILE");
  return v == nullptr ? 0 : std::strcmp(v, "64") == 0 ? 64 : std::strcmp(v, "128") == 0 ? 128 : 0;
}()};
}  // namespace

int tile_m(int pairs, int E) {
  const int forced = g_tile_m.load(std::memory_order_relaxed);
  if (forced != 0) return forced;
  return static_cast<int64_t>(pairs) <= 96 * static_cast<int64_t>(E) ? 64 : 128;
}

int tile_m_merged(int pairs, int E) {  // rows a merged group: 2 pairs / E on average
  const int64_t rows2 = 2 * static_cast<int64_t>(pairs);
  return rows2 > 160 * static_cast<int64_t>(E) ? 256 : tile_m(2 * pairs, E);
}
void set_tile_m(int m) { g_tile_m.store(tile_arg(m), std::memory_order_relaxed); }

namespace {
std::atomic<bool> g_two_launch{[] {  // K3_MOE_CUTLASS_X2=two: Bf16x2's two-launch form (A/B)
  const char* v = std::getenv("K3_MOE_CUTLASS_X2");
  return v != nullptr && std::strcmp(v, "two") == 0;
}()};
}  // namespace
void set_split_two_launches(bool two) { g_two_launch.store(two, std::memory_order_relaxed); }

namespace {
std::atomic<bool> g_bf16_out{[] {  // K3_MOE_CUTLASS_BF16_OUT=0: fp32 outputs at Bf16 precision too (A/B)
  const char* v = std::getenv("K3_MOE_CUTLASS_BF16_OUT");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};
}  // namespace
void set_bf16_outputs(bool on) { g_bf16_out.store(on, std::memory_order_relaxed); }

bool enabled_by_env() {
  static const bool on = [] {
    const char* v = std::getenv("K3_MOE_CUTLASS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

namespace {
// The scratch for this workspace's shape, made on first use (or remade if the bank's shape or device changed).
cudaError_t ensure_scratch(const ExpertBank& w, int max_pairs, ScratchPtr& s) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaErrorInvalidDevice;
  if (s && s->max_pairs == max_pairs && s->E == w.E && s->I == w.I && s->X == w.X && s->device == device)
    return cudaSuccess;
  s.reset();
  std::unique_ptr<Scratch> fresh(new (std::nothrow) Scratch);
  if (!fresh) return cudaErrorMemoryAllocation;
  fresh->max_pairs = max_pairs;
  fresh->E = w.E;
  fresh->I = w.I;
  fresh->X = w.X;
  fresh->device = device;
  int sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  e = cudaMalloc(&fresh->act, 2 * static_cast<size_t>(max_pairs) * w.X * sizeof(__nv_bfloat16));
  if (e != cudaSuccess) {
    fresh->act = nullptr;
    return e;
  }
  e = make_grouped(fresh->gate_up, 2 * w.E, w.I, w.X, device, sms);
  if (e == cudaSuccess) e = make_grouped(fresh->down, w.E, w.X, w.I, device, sms);
  if (e != cudaSuccess) return e;
  s.reset(fresh.release());
  return cudaSuccess;
}

// The one-launch Bf16x2 form's groups and outputs (max(4 I, 2 X) max_pairs floats), on first use.
cudaError_t ensure_split(Scratch& s) {
  if (s.d2) return cudaSuccess;
  int sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s.device);
  if (e != cudaSuccess) return e;
  const size_t floats = static_cast<size_t>(s.max_pairs) * std::max(4 * s.I, 2 * s.X);
  float* d2 = nullptr;
  if ((e = cudaMalloc(&d2, floats * sizeof(float))) != cudaSuccess) return e;
  e = make_grouped(s.gate_up2, 2 * s.E, s.I, s.X, s.device, sms, true);
  if (e == cudaSuccess) e = make_grouped(s.down2, s.E, s.X, s.I, s.device, sms, true);
  if (e != cudaSuccess) {
    cudaFree(d2);
    return e;
  }
  s.d2 = d2;
  return cudaSuccess;
}

// bf16_out: the bf16-output objects (beta 0 only).
cudaError_t launch(Grouped& g, int tile, bool accumulate, cudaStream_t stream, bool bf16_out = false) {
  const cutlass::Status st = tile == 256              ? g.set256.run(stream)
                             : bf16_out && tile == 64 ? g.set64h.run(stream)
                             : bf16_out               ? g.set128h.run(stream)
                             : tile == 64             ? (accumulate ? g.add64 : g.set64).run(stream)
                                                      : (accumulate ? g.add128 : g.set128).run(stream);
  if (st != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaGetLastError();
}
}  // namespace

bool can_run_on(const ScratchPtr& scratch, cudaStream_t stream) {
  if (scratch) return true;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone;
}

cudaError_t run(const Args& a, int max_pairs, ScratchPtr& scratch, cudaStream_t stream, Output* out) {
  if (!a.w || !a.x || !a.sorted || !a.expert_off || !a.hidden || !a.y || !out) return cudaErrorInvalidValue;
  const ExpertBank& w = *a.w;
  if (!supports(w) || a.n <= 0 || a.K <= 0 || static_cast<int64_t>(a.n) * a.K > max_pairs) return cudaErrorInvalidValue;
  cudaError_t e = ensure_scratch(w, max_pairs, scratch);
  if (e != cudaSuccess) return e;
  Scratch& s = *scratch;
  // (Its buffers are made on first use: under a CUDA graph capture, which allows no allocation, the two-launch form.)
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  const bool can_make = s.d2 || (cudaStreamIsCapturing(stream, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone);
  const bool one_launch = a.split && !g_two_launch.load(std::memory_order_relaxed) && can_make;
  if (one_launch && (e = ensure_split(s)) != cudaSuccess) return e;
  const int E = w.E, I = w.I, X = w.X, P = a.n * a.K;
  __nv_bfloat16* hi = s.act;
  __nv_bfloat16* lo = a.split ? s.act + static_cast<size_t>(max_pairs) * X : nullptr;
  const auto* gate = static_cast<const uint16_t*>(w.gate);
  const auto* up = static_cast<const uint16_t*>(w.up);
  const auto* down = static_cast<const uint16_t*>(w.down);
  gather_rows<<<P, 128, 0, stream>>>(a.K, X, E, a.expert_off, a.sorted, a.x, hi, lo, one_launch);
  const auto* h16 = reinterpret_cast<const uint16_t*>(hi);
  const auto* l16 = reinterpret_cast<const uint16_t*>(lo);
  if (one_launch) {  // an expert's hi and lo rows in one group: each weight tile loaded once for both
    const int tile = tile_m_merged(P, E);
    float *g_out = s.d2, *u_out = s.d2 + 2 * static_cast<int64_t>(max_pairs) * I;
    fill_groups<<<(2 * E + 127) / 128, 128, 0, stream>>>(E, I, X, true, a.expert_off, h16, gate, g_out, up, u_out,
                                                          s.gate_up2.shapes, s.gate_up2.a, s.gate_up2.b, s.gate_up2.d);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = launch(s.gate_up2, tile, false, stream)) != cudaSuccess) return e;
    glu_rows<<<P, 128, 0, stream>>>(E, I, a.expert_off, g_out, u_out, true, a.act, a.beta, a.lbeta, hi, lo);
    fill_groups<<<(E + 127) / 128, 128, 0, stream>>>(E, X, I, true, a.expert_off, h16, down, s.d2, nullptr, nullptr,
                                                      s.down2.shapes, s.down2.a, s.down2.b, s.down2.d);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = launch(s.down2, tile, false, stream)) != cudaSuccess) return e;
    *out = Output{s.d2, 0, 2, a.expert_off};  // the combine adds each slot's merged rows: the epilogue's fp32 sum
    return cudaGetLastError();
  }
  const int tile = tile_m(P, E);
  // Bf16 precision: the GEMMs write bf16 (rounded in the epilogue, as the h and x operands already are; the GLU and
  // the combine read half the bytes). Bf16x2's two-launch form accumulates its lo pass: fp32.
  const bool bf16_out = !a.split && g_bf16_out.load(std::memory_order_relaxed);
  const int ob = bf16_out ? 2 : 4;
  float* up_out = a.y;  // [P][I] until down overwrites it as [P][X] (I <= X)
  const int halves = a.split ? 2 : 1;
  for (int h = 0; h < halves; ++h) {  // gate and up: E + E groups, the lo pass accumulating
    fill_groups<<<(2 * E + 127) / 128, 128, 0, stream>>>(E, I, X, false, a.expert_off, h ? l16 : h16, gate, a.hidden,
                                                          up, up_out, s.gate_up.shapes, s.gate_up.a, s.gate_up.b,
                                                          s.gate_up.d, ob);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = launch(s.gate_up, tile, h == 1, stream, bf16_out)) != cudaSuccess) return e;
  }
  // h's rows replace x's (x is no longer read): [P][I] in each half's [max_pairs][X] region.
  if (bf16_out)
    glu_rows<<<P, 128, 0, stream>>>(E, I, a.expert_off, reinterpret_cast<const __nv_bfloat16*>(a.hidden),
                                    reinterpret_cast<const __nv_bfloat16*>(up_out), false, a.act, a.beta, a.lbeta, hi, lo);
  else
    glu_rows<<<P, 128, 0, stream>>>(E, I, a.expert_off, a.hidden, up_out, false, a.act, a.beta, a.lbeta, hi, lo);
  for (int h = 0; h < halves; ++h) {
    fill_groups<<<(E + 127) / 128, 128, 0, stream>>>(E, X, I, false, a.expert_off, h ? l16 : h16, down, a.y, nullptr,
                                                      nullptr, s.down.shapes, s.down.a, s.down.b, s.down.d, ob);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = launch(s.down, tile, h == 1, stream, bf16_out)) != cudaSuccess) return e;
  }
  *out = Output{a.y, 0, 1, nullptr, bf16_out};
  return cudaGetLastError();
}

}  // namespace k3::cuda::moe_cutlass
