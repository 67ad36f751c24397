// MoE kernels for the CUDA backend (model-spec section 3.4): routing on the GPU and grouped expert
// GLU FFNs over MXFP4 (W4A16: weights dequantised in registers) or bf16 experts. The CPU reference is
// moe_layer() in model/ffn_layers.cpp. Activations fp32, accumulation fp32. All pointers are device
// pointers; kernels are enqueued on `stream`; calls return the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "k3/core/weight.h"

namespace k3::cuda {

namespace moe_cutlass {  // moe_grouped_gemm.h: the CUTLASS path's scratch, held by a MoeWorkspace
class Scratch;
struct ScratchDeleter {
  void operator()(Scratch* s) const;
};
using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;
}  // namespace moe_cutlass

// All E routed experts of one layer, stacked (core/weight.h ExpertStack):
//   bf16:  gate, up [E][I][X]; down [E][X][I]   (uint16_t bf16 bits)
//   mxfp4: gate, up packed [E][I][X/2] + scales [E][I][X/32]; down packed [E][X][I/2] + scales [E][X][I/32]
//          (model-spec section 4: low nibble = even element, E2M1 values, E8M0 scales; see mxfp4_gemv.cu)
// X = expert input width (hidden size, or K3's latent width), I = moe_intermediate_size; X, I % 32 == 0
// for MXFP4, X, I % 8 == 0 for bf16 (tiny Kimi-Linear has I = 48). Weight and x/out pointers 16-byte aligned.
// format: MXFP4, BF16, or a GGUF block format (quant_tables.h is_gguf_block; down in down_format where that is
// one too; widths whole blocks) through quant_moe.h's three kernel sets: MoePath TensorCore = the tensor-core
// tiles (prefill; weights decoded exactly then rounded to bf16, activations bf16, ~1e-3 relative), TcDecode = the
// grouped decode kernels (formats with a part decoder), Gemv = the per-pair kernels (every format; both exact
// fp32), Auto = quant_moe_choice; Simt is cudaErrorInvalidValue. cudaErrorInvalidValue for any other format.
using ExpertBank = ExpertStack;

enum class GluAct : int { SiLU = 0, SiTU = 1 };

// Activation precision of the tensor-core expert path (weights are exactly bf16 there: bf16 as stored, or
// MXFP4 dequantised to bf16 exactly). Bf16x2: activations split x = hi + lo (both bf16), two MMAs
// accumulated in fp32 (~1e-5 relative, matches the fp32 CPU reference); Bf16: x rounded to bf16 (~1e-3
// relative, about half the tensor-core work). The SIMT path is fp32 throughout and ignores this.
// Mxfp8: --moe-activation-dtype mxfp8 (core/mxfp8.h): x and each GLU output rounded to MXFP8 along the row, as the CPU
// backend does. Decode batches of MXFP4 experts that moe_w4a8_supported takes (I, X multiples of 128, a
// compute-capability-9.0 device; n K within the decode scratch, at most 8 pairs an expert) run on the FP8 tensor cores (moe_decode_w4a8.h: Auto
// or TcDecode); everything else (Auto, TensorCore or Wgmma: any n, MXFP4 / BF16 / GGUF experts) on the bf16 tensor-core
// tiles fed exact MXFP8 values (moe_kernels.cu moe_experts_mxfp8). Other paths: cudaErrorInvalidValue.
enum class MoePrecision : int { Bf16x2 = 0, Bf16 = 1, Mxfp8 = 2 };

// Which expert kernels moe_experts runs. Auto: the 64-pair tensor-core tiles when moe_experts_use_tc(n, K, E),
// else the decode tensor-core kernels (moe_decode.cu; the SIMT tiles when K3_MOE_DECODE=simt is set in the
// environment, for before/after comparisons). TcDecode: the decode kernels at any n (n * K <= the workspace's
// decode capacity, else cudaErrorInvalidValue). Gemv: every pair as a plain GEMV, two launches, no sorting
// (moe_gemv.cu; Auto's choice for bf16 experts up to a pair per 8 experts, session 13).
// Wgmma: the tensor-core tiles on warpgroup MMAs (sm90a/moe_prefill_wgmma.cu; MXFP4 / BF16 experts on a
// compute-capability-9.0 device, else cudaErrorInvalidValue); Auto's TensorCore choice runs them unless
// K3_MOE_WGMMA=0 (moe_prefill_wgmma.h).
// WgmmaRs: the same tiles with the weights decoded straight into the register A operand (MXFP4 experts only).
// WgmmaRing: the register-A tiles fed by a cp.async ring of MXFP4 bytes and bf16 activation planes (MXFP4 experts,
// moe_wg::ring_supports; with MoePrecision::Mxfp8's tile form it rounds the GLU outputs itself); Auto's TensorCore choice
// for such banks unless K3_MOE_WGMMA is smem, rs or 0.
// Cutlass: CUTLASS's grouped GEMMs (moe_grouped_gemm.h; BF16 experts, I <= X, a compute-capability-9.0 device, else
// cudaErrorInvalidValue); Auto's TensorCore choice for such banks runs them (since session 57; K3_MOE_CUTLASS=0: the tiles).
enum class MoePath : int { Auto = 0, Simt = 1, TensorCore = 2, TcDecode = 3, Gemv = 4, Wgmma = 5, WgmmaRs = 6, Cutlass = 7,
                           WgmmaRing = 8 };

// Auto's rule (measured on an H200, docs/perf/cuda.md "Session 4" and "Session 13"): for bf16 experts the GEMV
// path while n * K * 8 <= E (K3_MOE_GEMV=0 in the environment turns that off); the 64-pair tensor-core tiles above 8
// (token, expert) pairs per expert (n * K > 8 E); the decode tensor-core kernels at every smaller batch for
// MXFP4 (session 21: the ring kernel beats SIMT from n = 1) or, for bf16, from 1/4 pair per expert on the skinny kernels (moe_skinny.cu, session 8; moe_experts
// keeps the session-4 bf16 threshold, above 2 pairs per expert, for I or X not multiples of 32, and
// K3_MOE_SKINNY=0 restores it everywhere); the SIMT tiles below. K3_MOE_DECODE=simt in the environment
// restores the session-3 rule (SIMT below 4 pairs per expert, else the 64-pair tiles) for comparisons.
MoePath moe_experts_auto_path(int n, int K, int E, WeightFormat format);
// moe_experts_auto_path(...) == MoePath::TensorCore.
bool moe_experts_use_tc(int n, int K, int E, WeightFormat format = WeightFormat::MXFP4);

// Routing for n tokens: s = sigmoid(logits); the K experts with the highest s + bias (ties to the lower
// expert id); weight = (renormalize ? s / (sum of the K chosen s + 1e-20) : s) * scale.
// logits [n][E]; bias [E]; topk_idx [n][K] int32 (in rank order); topk_w [n][K]. K <= 32, E <= 4096.
// `form` (tests and timings): Auto is the rule (Block); Warp = one warp a token (E <= 1024), Block = four warps a token (E <= 1024),
// Scan = the 256-thread scan kernel (any E); a form that cannot take E falls back to the rule.
enum class RouteForm { Auto, Warp, Block, Scan };
cudaError_t moe_route(int n, int E, int K, const float* logits, const float* bias, bool renormalize, float scale,
                      int32_t* topk_idx, float* topk_w, cudaStream_t stream, RouteForm form = RouteForm::Auto);

// Scratch for moe_experts, allocated once for at most `max_tokens` tokens (no allocation per step).
class MoeWorkspace {
 public:
  MoeWorkspace() = default;
  MoeWorkspace(int max_tokens, int K, int E, int I, int X);  // cudaMalloc; throws k3::Error on failure
  ~MoeWorkspace();
  MoeWorkspace(const MoeWorkspace&) = delete;
  MoeWorkspace& operator=(const MoeWorkspace&) = delete;
  int max_tokens() const { return max_tokens_; }
  size_t bytes() const { return bytes_; }

 private:
  friend cudaError_t moe_experts(const ExpertBank&, int, int, const float*, const int32_t*, const float*, GluAct,
                                 float, float, float*, MoeWorkspace&, cudaStream_t, MoePrecision, MoePath);
  friend cudaError_t moe_experts_with_shared(const ExpertBank&, const void*, const void*, const void*, int, int,
                                             const float*, const int32_t*, const float*, GluAct, float, float, float*,
                                             MoeWorkspace&, cudaStream_t);
  friend bool moe_shared_fusable(const ExpertBank&, int64_t, int64_t, int64_t, int64_t, int, const MoeWorkspace&);
  friend cudaError_t moe_experts_mxfp8(const ExpertBank&, int, int, const float*, const int32_t*, const float*, GluAct,
                                       float, float, float*, MoeWorkspace&, cudaStream_t, MoePath);
  friend cudaError_t moe_experts_body(const ExpertBank&, int, int, const float*, const int32_t*, const float*, GluAct,
                                      float, float, float*, MoeWorkspace&, cudaStream_t, MoePrecision, MoePath, bool);
  int max_tokens_ = 0, K_ = 0, E_ = 0, I_ = 0, X_ = 0;
  size_t bytes_ = 0;
  void* base_ = nullptr;  // one allocation, carved into the buffers below
  // Carved buffers (set in the constructor); P = max_tokens * K (token, k) pairs, pair p = t * K + k.
  int32_t* num_tiles_ = nullptr;  // [1] tiles written by the plan kernel
  // Decode path scratch (moe_decode.h): bf16 activations, bf16 GLU outputs, split-K partial sums.
  int dec_pairs_ = 0, dec_tokens_ = 0;
  uint16_t* dec_xb_ = nullptr;
  uint16_t* dec_hb_ = nullptr;
  float* dec_part_ = nullptr;
  int64_t dec_part_floats_ = 0;
  int32_t* sorted_ = nullptr;     // [P] pair ids grouped by expert (slot -> pair)
  int32_t* slot_of_ = nullptr;    // [P] where each pair landed (pair -> slot), -1 for an invalid expert id
  int32_t* tiles_ = nullptr;      // [max tiles][4] (expert, first slot, pair count, 0); tiles of 2 (GGUF grouped), 4, 8, 16 or 64 pairs
  int32_t* expert_off_ = nullptr; // [E + 1] first slot of each expert, [E] the valid pairs (the CUTLASS path's groups)
  moe_cutlass::ScratchPtr cutlass_;  // made on the CUTLASS path's first use
  float* hidden_ = nullptr;       // [P][I] act(gate) * up, by slot
  float* y_ = nullptr;            // [P][X] expert outputs, by slot
  int max_tiles_ = 0;
};

// out[t] = sum_k topk_w[t][k] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = topk_idx[t][k]; out [n][X]
// (overwritten). act: SiLU(g) = g*sigmoid(g); SiTU(g, u) = beta*tanh(g/beta)*sigmoid(g) * lbeta*tanh(u/lbeta)
// (cpu::situ_glu). The sum over k runs in rank order k = 0..K-1, so results do not depend on scheduling.
// n <= ws.max_tokens(). precision: the tensor-core path's activation rounding; path: force a path (tests,
// benchmarks) or Auto (moe_experts_use_tc).
cudaError_t moe_experts(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx,
                        const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                        MoeWorkspace& ws, cudaStream_t stream, MoePrecision precision = MoePrecision::Bf16x2,
                        MoePath path = MoePath::Auto);

// The routed experts and one shared expert of their shape in the GEMV path's two launches (moe_gemv.h
// moe_gemv_experts_shared): out[t] = moe_experts(...)[t] + shared(x[t]). Only where moe_shared_fusable says so:
// bf16 experts on the device, Auto's GEMV path for n tokens, the shared gate / up [I][X] and down [X][I] bf16, the
// workspace's hidden rows enough for n x (K + 1) pairs, K3_MOE_SHARED_FUSED not 0 (the A/B switch);
// cudaErrorInvalidValue otherwise.
bool moe_shared_fusable(const ExpertBank& w, int64_t gate_rows, int64_t gate_cols, int64_t down_rows, int64_t down_cols,
                        int n, const MoeWorkspace& ws);
cudaError_t moe_experts_with_shared(const ExpertBank& w, const void* shared_gate, const void* shared_up,
                                    const void* shared_down, int n, int K, const float* x, const int32_t* topk_idx,
                                    const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                                    MoeWorkspace& ws, cudaStream_t stream);

}  // namespace k3::cuda
