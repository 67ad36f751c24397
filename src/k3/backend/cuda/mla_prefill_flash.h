// MLA prefill attention in one fused kernel (flash-attention form): the causal softmax(Q K^T) V of one sequence's
// new tokens over its expanded keys / values, without materialising the scores.
//
// Why: the MHA prefill (CudaBackend::mla_prefill_mha) wrote nh x tq x keys fp32 scores per query chunk and ran its
// products as fp32 SGEMMs: 21% of a Kimi-Linear-dims pp4096 step (call s40-2, H200). Splitting those products into
// bf16 halves on cuBLAS made it slower (s40-8): the scores' memory traffic, written and read by each of the three
// products, set the time. Here the scores live in registers: per block 64 queries of one head, per step 64 keys,
// tensor-core products (mma.sync m16n8k16) on hi + lo bf16 halves of every operand (lo.hi + hi.lo + hi.hi: ~16
// mantissa bits, as the projections' bf16x2 GEMMs), an online softmax in fp32, P V on the same halves.
//
// Session 40 wrote it splitting each tile while staging it (1.5x slower than the SGEMM form, call s41-1); session
// 41's form splits the operands once in place and streams the tiles with cp.async (mla_prefill_flash.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// One prefill-form sequence's MLA attention, rows [offset, offset + n) of q and out, its keys at positions
// 0 .. past + n - 1 (query t at position past + t sees keys 0 .. past + t):
//   q   [rows][nh][qk] fp32, qk = dn + dr (the nope part, then the rope part)
//   kv  [S][nh][dn + dv] fp32, S = past + n: each key's expanded nope key, then its value
//   kr  [S] rows of `kr_stride` floats: the shared rope key of each position at kr + s * kr_stride (dr floats)
//   out [rows][nh][dv] fp32
// kv's rows and kr's dr floats per row are OVERWRITTEN (each row rewritten in place as its bf16 hi / lo halves): the
// caller passes scratch copies (the backend's expanded K / V and gathered latents); nothing else in kr's rows is touched.
// `scale` multiplies the scores before the softmax. Supported: dn = 128, dr = 64, dv = 128 (K3 and Kimi-Linear);
// returns cudaErrorInvalidValue for other shapes (the caller keeps its SGEMM form).
// bf16_products: the products on the hi halves alone -- bf16 operands (q, k, v and P rounded to nearest), fp32
// accumulation and softmax, as flash attention runs in bf16 -- for --gemm-precision bf16 (one product a k16 step
// instead of three, half the shared memory: two blocks an SM); false: the hi / lo form above.
bool mla_prefill_flash_supports(int dn, int dr, int dv);
cudaError_t mla_prefill_flash(const float* q, float* kv, float* kr, int64_t kr_stride, int nh, int dn, int dr, int dv,
                              int64_t offset, int64_t n, int64_t past, float scale, float* out, cudaStream_t stream,
                              bool bf16_products = false);

}  // namespace k3::cuda
