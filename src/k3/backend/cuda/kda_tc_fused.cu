// Fused chunked KDA prefill on tensor cores (chunk 32, D = 128, bf16 q / k / v / g): ONE kernel per call, one
// block per (sequence, head) that walks the sequence's chunks, so the per-chunk operands W, U, Q exp(G),
// exp(G_last - G) k, A_qk and exp(G_last) never leave the SM. The two-kernel path (kda_chunked_tc.cu: intra
// v3cs writes those planes to HBM, the state kernel v2 reads them back) moves ~3.5 GB at the K3 shape (1 x 8192
// tokens x 96 heads), a 0.74-0.87 ms floor (docs/perf/cuda.md, session 26); fused, only q, k, v, g, beta in and o
// out (+ the states) cross HBM: ~1.2 GB.
//
// Block = 16 warps, warp-specialised:
//   warps 0-7 (producer): the intra-chunk work of chunk c (v3's arithmetic: G by a shuffle scan, the products
//     A_kk / A_qk on tensor cores, the blocked inverse T, W = T exp(G) k and U = T v), written into ring buffer
//     c % NBUF in the state kernel v2's operand layout; chunk c + 1's q / k / v / g / beta stream into the other of
//     two input stages with cp.async while chunk c computes. Their own barriers are named barrier 1 (256 threads),
//     six per chunk.
//   warps 8-15 (consumer): the state step of chunk c (state kernel v2 at 8 warps: warp w holds S^T for value
//     columns [16 w, 16 w + 16) in 64 fp32 registers; V~ = U - W S, O = Q S + A_qk V~, S = diag(eL) S + K^T V~,
//     all warp-local) reading ring buffer c % NBUF, the output stored from the fragments.
//   Hand-off: per ring buffer b a FULL barrier (producer bar.arrive after its stores of the chunk, consumer
//   bar.sync before reading) and an EMPTY barrier (consumer bar.arrive after its last read, producer bar.sync
//   before its first store of chunk c + NBUF): named barriers 2 + b and 2 + NBUF + b, 512 threads each. So the
//   producer runs up to NBUF chunks ahead and the chunk period is max(intra, state) instead of their sum. (PTX: an
//   arrive's prior accesses are performed when the barrier completes, a sync issues nothing before it does.
//   compute-sanitizer racecheck reports the ring accesses across these arrive / sync pairs as hazards, call
//   s27-kda-1; memcheck is clean and every check is bit-identical, so they are taken as its not modelling arrive.)
// Variants (KdaTcTuning::fused): 2 = two ring buffers, 3 = three, 4 = 2 with every exponential in the ftz form,
// 5 = 4 with T applied by the consumer (state_vnew_t: the producer's W / U products and a barrier go).
// Arithmetic: the v2 / v3 intra helpers (kda_tc_intra2.cuh) and the state kernel v2's step helpers
// (kda_tc_state2_ops.cuh) are the two-kernel path's own definitions (moved there from kda_chunked_tc.cu and
// kda_tc_state2.cu; the PTX of all three files was compared identical before and after). Only the destinations of
// the intra outputs change (shared ring rows, all 32 rows written: padded rows come out as exact zeros, as the
// state kernel's zero-filled copies are), so o, the final and the per-chunk states of variants 2 / 3 are
// BIT-identical to intra v3 / v3cs + state v2 for decays g > -5.45 (exp_ftz says why the bound;
// scripts/check_kda_tc.py and CudaKdaTc.FusedBitwiseEqualsSequential compare); 4 / 5 round differently.
// Resources: 512 threads at 128 registers (one block per SM; variant 5: 16 bytes of spills), shared memory
// 115.6 KB (intra scratch 52.6 KB + two 32.1 KB input stages) + NBUF x 37.0 KB ring (+ 2.5 KB for T in 5).
// Measured (H200, one-process bench, docs/perf/cuda/s27-kda-2-bench.log), 1 x 8192 x 96: variant 5 0.925 ms, 2 1.025,
// the two kernels 1.266; the producer alone (K3_KDA_TC_FUSED_SKIP=consumer) 0.718 / 0.830, the consumer alone ~0.49:
// the kernel is bound by the producer's chain (ncu: ~1270 instructions per producer warp and chunk, half of them in
// the exponential-heavy elementwise phase; the 16-step diagonal substitutions on one warp while seven wait at the
// next barrier ~20% of it) plus the consumer's share of the issue slots. HBM: ~1.2 GB, 25% of its bandwidth.
// Limits of the form: one block per (sequence, head) is one serial chain per SM; at 1 x 8192 x 96 that is 96 of
// 132 SMs (at 32 heads 32 SMs: 0.92 ms against the two kernels' 0.61).
#include "k3/backend/cuda/kda_tc_fused.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "k3/backend/cuda/kda_tc_common.cuh"
#include "k3/backend/cuda/kda_tc_intra2.cuh"
#include "k3/backend/cuda/kda_tc_state2_ops.cuh"

namespace k3::cuda {
namespace {

// The input stage (v3's, reshaped): per chunk the head's 32 rows of g, k, q, v (8 KB planes of 256-byte rows, the
// 16-byte chunks XOR-swizzled as in v3) and beta, TWO stages (chunk c in stage c % 2). v3 streamed g / k / beta into a
// stage of its own and q / v into the Kl / Kr scratch planes once the products were done with them, which cost a
// second barrier per item (the stage read before the refill and before elementwise overwrites Kl / Kr); with two full
// stages (64 KB: the fused block has the shared memory) the next chunk's loads are issued right after the top
// barrier, a whole chunk ahead, and that barrier is gone.
struct FusedStage {
  static constexpr int L = Intra2Cfg::L, NT = Intra2Cfg::NT;
  static constexpr size_t plane = static_cast<size_t>(L) * kD * sizeof(bf16);  // 8 KB
  static constexpr size_t off_g = 0, off_k = plane, off_q = 2 * plane, off_v = 3 * plane, off_b = 4 * plane;
  static constexpr size_t bytes = off_b + L * sizeof(float);
  static constexpr size_t off_stage0 = Intra2Cfg::bytes;  // after v2's intra scratch
  static constexpr size_t end = off_stage0 + 2 * bytes;
  static_assert(off_stage0 % 16 == 0 && bytes % 16 == 0, "cp.async alignment");
};

struct FusedItem {
  int Lc;       // valid rows
  size_t at0;   // element offset of the chunk's first row, the head's first column
  size_t brow;  // beta offset of the chunk's first row, the head
};

// One plane of an item into a stage (intra3_copy_rows from the item's offset).
__device__ __forceinline__ void fused_copy_plane(char* dst, const bf16* __restrict__ src, const FusedItem& w, int C,
                                                 int tid) {
  intra3_copy_rows(dst, src + w.at0, w.Lc, C, tid);
}

// All of a chunk's inputs into stage st, one commit group (beta by 4-byte copies: it is [N][H], strided by H).
__device__ __forceinline__ void fused_issue(char* st, const bf16* __restrict__ q, const bf16* __restrict__ k,
                                            const bf16* __restrict__ v, const bf16* __restrict__ g,
                                            const float* __restrict__ beta, const FusedItem& w, int H, int C,
                                            int tid) {
  fused_copy_plane(st + FusedStage::off_g, g, w, C, tid);
  fused_copy_plane(st + FusedStage::off_k, k, w, C, tid);
  fused_copy_plane(st + FusedStage::off_q, q, w, C, tid);
  fused_copy_plane(st + FusedStage::off_v, v, w, C, tid);
  if (tid < FusedStage::L) {
    const bool ok = tid < w.Lc;
    cp_async4(st + FusedStage::off_b + 4 * tid, beta + w.brow + static_cast<size_t>(ok ? tid : 0) * H, ok);
  }
  cp_async_commit();
}

// The thread's tile (rows r0 + u, columns [d, d + 4)) from a stage: g converted to fp32 as intra2_convert does; q, k,
// v taken as stored. intra2_convert rounds them to bf16 again, which returns the same bits for bf16 inputs (finite
// values: unpack is exact, the repack is exact), so the tile is v3's bit for bit, 72 instructions a chunk cheaper.
__device__ __forceinline__ void fused_read(const char* st, int r0, int d, Intra2Tile& t) {
  const int c = d >> 3, o = 2 * (d & 7);  // chunk, byte offset in it (0 or 8)
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int at = intra3_stage_off(r0 + u, c) + o;
    const float4 gr = raw_to4(*reinterpret_cast<const uint2*>(st + FusedStage::off_g + at));
    const uint2 qr = *reinterpret_cast<const uint2*>(st + FusedStage::off_q + at);
    const uint2 kr = *reinterpret_cast<const uint2*>(st + FusedStage::off_k + at);
    const uint2 vr = *reinterpret_cast<const uint2*>(st + FusedStage::off_v + at);
    t.G[u][0] = gr.x;
    t.G[u][1] = gr.y;
    t.G[u][2] = gr.z;
    t.G[u][3] = gr.w;
    t.q[u][0] = qr.x;
    t.q[u][1] = qr.y;
    t.k[u][0] = kr.x;
    t.k[u][1] = kr.y;
    t.v[u][0] = vr.x;
    t.v[u][1] = vr.y;
  }
}

// ---------------------------------------------------------------------------------------------------
// The ring buffer: the state kernel v2's operand layout (field names as State2Cfg, so the copied state-step
// helpers below read it unchanged), with U holding all 128 value columns (LDU = LDB). Placed after v3's intra
// scratch and input stage. The variant's switches ride along: kFast (every exponential in the ftz form, exp_ftz)
// and kT (the consumer applies T: the W / U slots hold exp(G) k and v, and T [L][LDA] follows eL; see
// state_vnew_t).
template <int NBUF_, bool kFast_ = false, bool kT_ = false>
struct FusedCfg {
  static constexpr int L = 32, NBUF = NBUF_, NPT = 256, NT = 512;  // producer threads, all threads
  static constexpr bool kFast = kFast_, kT = kT_;
  static constexpr int LDB = kD + 8, LDA = L + 8, LDU = kD + 8;
  static constexpr int off_w = 0, off_q = L * LDB * 2, off_k = 2 * L * LDB * 2, off_a = 3 * L * LDB * 2;
  static constexpr int off_u = off_a + L * LDA * 2, off_e = off_u + L * LDU * 2, off_t = off_e + kD * 4;
  static constexpr int buf_bytes = off_t + (kT ? L * LDA * 2 : 0);
  static_assert(LDA == Intra2Cfg::LDT, "T in the ring keeps the intra helpers' row stride");
  static constexpr size_t off_ring = FusedStage::end;
  static constexpr size_t bytes = off_ring + static_cast<size_t>(NBUF) * buf_bytes;
  static_assert(LDB == Intra2Cfg::LDB, "the intra helpers' row stride");
  static_assert(off_ring % 16 == 0 && off_a % 16 == 0 && off_u % 16 == 0 && off_e % 16 == 0 && buf_bytes % 16 == 0,
                "ldmatrix / vector alignment");
};

// Named barriers: 1 = the producer warps' own (256 threads); FULL / EMPTY of ring buffer b (512 threads).
constexpr int kBarProducer = 1;
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void pbar() { bar_sync(kBarProducer, 256); }
template <class Cfg>
__device__ __forceinline__ int bar_full(int b) { return 2 + b; }
template <class Cfg>
__device__ __forceinline__ int bar_empty(int b) { return 2 + Cfg::NBUF + b; }

// __expf(x) is x log2(e) (one fmul) then ex2.approx.f32, which ptxas builds as FSETP + two predicated FMULs around
// MUFU.EX2 so that results below 2^-126 come out denormal; for arguments whose ex2 input is >= -126 (x >= -87.3)
// ex2.approx.ftz.f32 returns the same bits with the MUFU alone. The exponentials of a span inside one 16-token
// sub-chunk (exp(G - G_ref), exp(G_ref - G): at most 15 tokens, or 16 for exp(G_16 - G_i) of rows i < 16) stay above
// -87.3 for every decay g > -5.45 (the K3 gate: g > -5), so they take the ftz form with v3's bits unchanged; exp(G)
// and exp(G_last - G) span up to 31 tokens and keep __expf unless kFast (then values below ~1e-38 flush to 0: not
// bit-identical to the two-kernel path, the same results otherwise). 3 of the ~4.5 exponentials per element: the
// elementwise phase went from ~750 to ~650 instructions per producer warp and chunk (ncu, calls s27-kda-1 / -2).
__device__ __forceinline__ float exp_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x * 1.4426950408889634f));
  return r;
}

struct ExpFtz {
  __device__ __forceinline__ float operator()(float x) const { return exp_ftz(x); }
};

// intra2_elementwise_to (kda_tc_intra2.cuh) with Q exp(G) and exp(G_last - G) k going to the ring rows (Qo, Ko:
// [L][LDB]), every row (the padded rows' inputs are zeros, so they are written as zeros); the sub-chunk exponentials
// in the ftz form, exp(G) / exp(G_last - G) too when kFast.
// KE, Vb: where exp(G) k and v go (v2's scratch planes; the ring's W / U slots when the consumer applies T).
template <bool kFast>
__device__ __forceinline__ void fused_elementwise(const Intra2Tile& t, const Intra2Refs& rf, int r0, int d, char* sp,
                                                  bf16* Qo, bf16* Ko, bf16* KE, bf16* Vb) {
  using ExpGD = std::conditional_t<kFast, ExpFtz, ExpFast>;
  intra2_elementwise_to<ExpGD, ExpFtz>(t, rf, r0, d, sp, KE, Vb, [&](int i, uint2 qg, uint2 kd) {
    const int o = i * Intra2Cfg::LDB + d;
    st8(Qo + o, qg);
    st8(Ko + o, kd);
  });
}

// intra2_products_to with A_qk (bf16, zeros above the diagonal) going to the ring's Ao [L][LDA], every row.
__device__ __forceinline__ void fused_products(const char* sp, float* Ak, bf16* Ao, int tid) {
  constexpr int LDA = FusedCfg<2>::LDA;  // A_qk's ring row stride
  intra2_products_to(sp, Ak, [&](int i, int j, float x0, float x1, bool zero_block) {
    bf16* arow = Ao + i * LDA;
    sts32(arow + j, pack2(j <= i ? x0 : 0.f, j + 1 <= i ? x1 : 0.f));
    if (zero_block) sts32(arow + j + 16, 0u);
  }, tid);
}

// intra2_apply_to<2> with W and U going to the ring's Wo / Uo [L][LDB], every row.
__device__ __forceinline__ void fused_apply(const char* sp, const bf16* Ts, bf16* Wo, bf16* Uo, int tid) {
  intra2_apply_to<2>(
      sp, Ts, Wo, Uo, [](int) { return true; }, [](bf16* dst, int i) { return dst + i * Intra2Cfg::LDB; },
      [](bf16* p, uint32_t v) { sts32(p, v); }, tid);
}

// state2_vnew when the consumer applies T (FusedCfg::kT): V~ = U - W S = T (v - exp(G) k S) with W = T exp(G) k and
// U = T v, so the producer's W / U products (and their barrier) go: the W / U slots hold exp(G) k and v. X^T =
// v^T - S^T (exp(G) k)^T is state2_vnew's arithmetic on those slots (fp32, packed to bf16 A fragments as V~^T was),
// then V~^T = X^T T^T as O^T += V~^T A_qk^T is formed (T lower triangular with its diagonal, [L][LDA] rows: the
// k-step above the diagonal skipped). Rounding: X is rounded to bf16 where the two-kernel path rounds W and U, so the
// bits differ from it (same accuracy class: every operand bf16, fp32 accumulation).
template <class Cfg>
__device__ __forceinline__ void state_vnew_t(const State2Ops& b, const bf16* T, const State2Lane& ln,
                                             const float (&st)[16][4], uint32_t (&va)[2][4], float (&ot)[4][4]) {
  uint32_t xa[2][4];
  state2_vnew<Cfg>(b, ln, st, xa, ot);
  float vt[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int m = 0; m < 4; ++m) vt[nt][m] = 0.f;
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int kk = 0; kk <= p; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, T + ln.offA + 16 * p * Cfg::LDA + 16 * kk);
      mma(vt[2 * p], xa[kk], a[0], a[1]);
      mma(vt[2 * p + 1], xa[kk], a[2], a[3]);
    }
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    va[kk][0] = pack2(vt[2 * kk][0], vt[2 * kk][1]);
    va[kk][1] = pack2(vt[2 * kk][2], vt[2 * kk][3]);
    va[kk][2] = pack2(vt[2 * kk + 1][0], vt[2 * kk + 1][1]);
    va[kk][3] = pack2(vt[2 * kk + 1][2], vt[2 * kk + 1][3]);
  }
}

// ---------------------------------------------------------------------------------------------------
// The producer warps (threads 0-255): v3's item loop over this block's chunks, outputs into the ring. Per chunk:
// top barrier (stage c landed; chunk c - 1 done with the scratch and with stage c + 1) -> chunk c + 1's loads issued
// -> tile read, G scan -> [EMPTY wait] -> elementwise (Q, K, eL to the ring) -> products (A_qk to the ring) ->
// diagonal inverses -> off-diagonal block -> T -> W, U to the ring -> FULL arrive: six producer barriers (v3: seven).
template <class Cfg>
__device__ __forceinline__ void fused_producer(char* sp, const KdaSeq& sq, int h, int H, int nch,
                                               const bf16* __restrict__ q, const bf16* __restrict__ k,
                                               const bf16* __restrict__ v, const bf16* __restrict__ g,
                                               const float* __restrict__ beta) {
  constexpr int L = Cfg::L, NBUF = Cfg::NBUF;
  float* Ak = reinterpret_cast<float*>(sp + Intra2Cfg::off_ak);
  float* bs = reinterpret_cast<float*>(sp + Intra2Cfg::off_bs);
  float* Mi = reinterpret_cast<float*>(sp + Intra2Cfg::off_mi);
  float* Xs = reinterpret_cast<float*>(sp + Intra2Cfg::off_xs);
  const int C = H * kD;
  auto item = [&](int c) {  // chunk c of the sequence
    FusedItem w;
    const size_t row0 = static_cast<size_t>(sq.offset) + static_cast<size_t>(c) * L;
    w.Lc = min(L, sq.n - c * L);
    w.at0 = row0 * C + static_cast<size_t>(h) * kD;
    w.brow = row0 * H + h;
    return w;
  };
  auto stage = [&](int c) { return sp + FusedStage::off_stage0 + (c & 1) * FusedStage::bytes; };
  fused_issue(stage(0), q, k, v, g, beta, item(0), H, C, tid_fresh());
  for (int c = 0;; ++c) {
    const bool more = c + 1 < nch;
    const int tid = tid_fresh();
    const int lane = tid % 32, seg = lane >> 2, cg = lane & 3, r0 = 4 * seg, d = 16 * (tid / 32) + 4 * cg;
    cp_async_wait<0>();
    pbar();  // stage c complete; chunk c - 1 done with the scratch and with stage c + 1 (= c - 1)
    if (more) fused_issue(stage(c + 1), q, k, v, g, beta, item(c + 1), H, C, tid);
    Intra2Tile t;
    fused_read(stage(c), r0, d, t);
    if (tid < L) bs[tid] = reinterpret_cast<const float*>(stage(c) + FusedStage::off_b)[tid];
    intra2_scan(t.G, lane);
    const Intra2Refs rf = intra2_refs(t.G, cg);
    const int rb = c % NBUF;
    char* ring = sp + Cfg::off_ring + rb * Cfg::buf_bytes;
    if (c >= NBUF) bar_sync(bar_empty<Cfg>(rb), Cfg::NT);  // the consumer is done with chunk c - NBUF's buffer
    fused_elementwise<Cfg::kFast>(
        t, rf, r0, d, sp, reinterpret_cast<bf16*>(ring + Cfg::off_q), reinterpret_cast<bf16*>(ring + Cfg::off_k),
        reinterpret_cast<bf16*>(Cfg::kT ? ring + Cfg::off_w : sp + Intra2Cfg::off_ke),
        reinterpret_cast<bf16*>(Cfg::kT ? ring + Cfg::off_u : sp + Intra2Cfg::off_v));
    if (seg == 7)
      *reinterpret_cast<float4*>(ring + Cfg::off_e + 4 * d) =
          make_float4(__expf(rf.gl[0]), __expf(rf.gl[1]), __expf(rf.gl[2]), __expf(rf.gl[3]));
    pbar();  // operands and beta complete
    fused_products(sp, Ak, reinterpret_cast<bf16*>(ring + Cfg::off_a), tid_fresh());
    pbar();  // Ak complete; Ql, Kl free for the inverse's scratch
    intra2_diag_inverse(Ak, Mi, tid_fresh());
    pbar();
    intra2_offdiag_x(Ak, Mi, Xs, tid_fresh());
    pbar();
    bf16* Ts = reinterpret_cast<bf16*>(Cfg::kT ? ring + Cfg::off_t : sp + Intra2Cfg::off_ts);
    intra2_write_t(Mi, Xs, bs, Ts, tid_fresh());
    if constexpr (!Cfg::kT) {
      pbar();
      fused_apply(sp, Ts, reinterpret_cast<bf16*>(ring + Cfg::off_w), reinterpret_cast<bf16*>(ring + Cfg::off_u),
                  tid_fresh());
    }
    bar_arrive(bar_full<Cfg>(rb), Cfg::NT);  // after each producer thread's stores of the chunk
    if (!more) break;
  }
}

// Chunks of the sequences before s (the row offset of s's per-chunk states): one warp, lanes stride the table.
__device__ __forceinline__ int fused_chunks_before(const KdaSeq* __restrict__ seqs, int s, int lane) {
  int n = 0;
  for (int i = lane; i < s; i += 32) n += n_chunks(seqs[i].n, 32);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) n += __shfl_xor_sync(0xffffffffu, n, off);
  return n;
}

// The consumer warps (threads 256-511): the state kernel v2's chunk loop, operands from the ring.
template <class Cfg>
__device__ __forceinline__ void fused_consumer(const char* sp, const KdaSeq* __restrict__ seqs, int s,
                                               const KdaSeq& sq, int h, int H, int nch, float* __restrict__ o,
                                               float* __restrict__ chunk_states) {
  constexpr int L = Cfg::L, NBUF = Cfg::NBUF;
  const int cw = static_cast<int>(threadIdx.x) / 32 - 8, lane = threadIdx.x % 32, vw = 16 * cw, C = H * kD;
  const State2Lane ln = state2_lane<Cfg>(cw, lane);
  const size_t hcol = static_cast<size_t>(h) * kD;
  const int cb = chunk_states ? fused_chunks_before(seqs, s, lane) : 0;
  float* Sg = sq.S + hcol * kD + vw;
  float st[16][4];
  state2_io<false>(st, Sg, ln);
  for (int c = 0; c < nch; ++c) {
    const int rb = c % NBUF;
    bar_sync(bar_full<Cfg>(rb), Cfg::NT);  // the producer's stores of chunk c are visible
    const State2Ops b = state2_ops<Cfg>(sp + Cfg::off_ring + rb * Cfg::buf_bytes);
    const int t0 = c * L, Lc = min(L, sq.n - t0);
    uint32_t va[2][4];
    float ot[4][4];
    if constexpr (Cfg::kT) {
      state_vnew_t<Cfg>(b, reinterpret_cast<const bf16*>(sp + Cfg::off_ring + rb * Cfg::buf_bytes + Cfg::off_t), ln,
                        st, va, ot);
    } else {
      state2_vnew<Cfg>(b, ln, st, va, ot);
    }
    state2_out<Cfg>(b, ln, va, ot, Lc, o + static_cast<size_t>(sq.offset + t0) * C + hcol + vw, C);
    state2_update<Cfg>(b, ln, va, st);
    if (c + NBUF < nch) bar_arrive(bar_empty<Cfg>(rb), Cfg::NT);  // the producer refills it with chunk c + NBUF
    if (chunk_states) state2_io<true>(st, chunk_states + (static_cast<size_t>(cb + c) * H + h) * kD * kD + vw, ln);
  }
  state2_io<true>(st, Sg, ln);
}

// A role's barrier protocol without its work (K3_KDA_TC_FUSED_SKIP, timing only: the outputs are wrong). Timing the
// kernel with the consumer idle gives the producer's chain alone, and the other way round; the full kernel's time
// against the two says how much of the hand-off overlaps.
template <class Cfg>
__device__ __forceinline__ void fused_idle(bool producer, int nch) {
  constexpr int NBUF = Cfg::NBUF;
  for (int c = 0; c < nch; ++c) {
    const int rb = c % NBUF;
    if (producer) {
      if (c >= NBUF) bar_sync(bar_empty<Cfg>(rb), Cfg::NT);
      bar_arrive(bar_full<Cfg>(rb), Cfg::NT);
    } else {
      bar_sync(bar_full<Cfg>(rb), Cfg::NT);
      if (c + NBUF < nch) bar_arrive(bar_empty<Cfg>(rb), Cfg::NT);
    }
  }
}

// Grid (n_seqs, H), 512 threads: one block per (sequence, head). The role branch is warp-uniform. skip: 0, or (timing
// only) 1 = the consumer idles, 2 = the producer idles.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::NT, 1)
    kda_tc_fused_kernel(const KdaSeq* __restrict__ seqs, int H, const bf16* __restrict__ q,
                        const bf16* __restrict__ k, const bf16* __restrict__ v, const bf16* __restrict__ g,
                        const float* __restrict__ beta, float* __restrict__ o, float* __restrict__ chunk_states,
                        int skip) {
  extern __shared__ float4 smem4[];
  char* sp = reinterpret_cast<char*>(smem4);
  const int s = blockIdx.x, h = blockIdx.y;
  const KdaSeq sq = seqs[s];
  if (sq.n <= 0) return;  // the whole block: no barrier is left waiting
  const int nch = n_chunks(sq.n, Cfg::L);
  const bool producer = threadIdx.x < Cfg::NPT;
  if (skip & (producer ? 2 : 1)) fused_idle<Cfg>(producer, nch);
  else if (producer) fused_producer<Cfg>(sp, sq, h, H, nch, q, k, v, g, beta);
  else fused_consumer<Cfg>(sp, seqs, s, sq, h, H, nch, o, chunk_states);
}

// K3_KDA_TC_FUSED_SKIP=consumer | producer: the timing-only skip of kda_tc_fused_kernel (unset: 0, the real kernel).
int fused_skip_env() {
  static const int v = [] {
    const char* e = std::getenv("K3_KDA_TC_FUSED_SKIP");
    if (e == nullptr) return 0;
    return std::strcmp(e, "consumer") == 0 ? 1 : std::strcmp(e, "producer") == 0 ? 2 : 0;
  }();
  return v;
}

template <class Cfg>
cudaError_t launch_fused(const KdaSeq* seqs, int n_seqs, int H, const bf16* q, const bf16* k, const bf16* v,
                         const bf16* g, const float* beta, float* o, float* chunk_states, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      kda_tc_fused_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::bytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(n_seqs), static_cast<unsigned>(H));
  kda_tc_fused_kernel<Cfg><<<grid, Cfg::NT, Cfg::bytes, stream>>>(seqs, H, q, k, v, g, beta, o, chunk_states,
                                                                   fused_skip_env());
  return cudaGetLastError();
}

}  // namespace

cudaError_t kda_tc_fused_launch(int variant, const KdaSeq* seqs, int n_seqs, int H, const void* q, const void* k,
                                const void* v, const void* g, const float* beta, float* o, float* chunk_states,
                                cudaStream_t stream) {
  if (variant < 2 || variant > 5) return cudaErrorInvalidValue;
  if (n_seqs <= 0) return cudaSuccess;
  const bf16 *tq = static_cast<const bf16*>(q), *tk = static_cast<const bf16*>(k), *tv = static_cast<const bf16*>(v),
             *tg = static_cast<const bf16*>(g);
  switch (variant) {
    case 3: return launch_fused<FusedCfg<3>>(seqs, n_seqs, H, tq, tk, tv, tg, beta, o, chunk_states, stream);
    case 4: return launch_fused<FusedCfg<2, true>>(seqs, n_seqs, H, tq, tk, tv, tg, beta, o, chunk_states, stream);
    case 5:
      return launch_fused<FusedCfg<2, true, true>>(seqs, n_seqs, H, tq, tk, tv, tg, beta, o, chunk_states, stream);
    default: return launch_fused<FusedCfg<2>>(seqs, n_seqs, H, tq, tk, tv, tg, beta, o, chunk_states, stream);
  }
}

}  // namespace k3::cuda
