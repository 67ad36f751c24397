// Elementwise and row-wise kernels of the forward pass on the GPU (the CPU reference of each is named).
// fp32 activations; device pointers; enqueued on `stream`; each returns the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// out[t][:] = bf16 table row tokens[t] (cpu::dequant_row of a bf16 embedding).
cudaError_t embed_rows(const uint16_t* table, int64_t H, const int32_t* tokens, int n, float* out, cudaStream_t s);

// Tensor parallel's vocab-parallel embedding (cpu::CpuBackend::embed_rows): out[t] (rows `stride` floats
// apart) = table row tokens[t] - first when that is in [0, count), else zeros.
cudaError_t embed_rows_shard(const uint16_t* table, int64_t H, const int32_t* tokens, int n, int64_t first, int64_t count,
                             int64_t stride, float* out, cudaStream_t s);
// ids[i] = table[ids[i]] for ids in [0, table_n), else -1 (expert parallel's moe_keep_experts).
cudaError_t map_ids(int32_t* ids, int64_t n, const int32_t* table, int64_t table_n, cudaStream_t s);

// cpu::rmsnorm over the first `dim` values of n rows `stride` floats apart; w may be null; out may alias x.
cudaError_t rmsnorm(const float* x, const float* w, int n, int dim, int stride, float eps, float* out, cudaStream_t s);

// y[i] += x[i]
cudaError_t add_inplace(float* y, const float* x, int64_t count, cudaStream_t s);
// y += x (n rows of dim values, `stride` apart, x with the same layout), then out = rmsnorm(y) * w as `rmsnorm`
// does: the same bits as add_inplace followed by rmsnorm, in one launch. out must not alias x.
cudaError_t add_rmsnorm(float* y, const float* x, const float* w, int n, int dim, int stride, float eps, float* out,
                        cudaStream_t s);
// y[i] *= sigmoid(g[i])
cudaError_t sigmoid_mul(float* y, const float* g, int64_t count, cudaStream_t s);
// gate[i] = act(gate[i]) * up[i]; SiLU (situ = false) or SiTU (cpu::situ_glu).
cudaError_t glu(float* gate, const float* up, int64_t count, bool situ, float beta, float linear_beta, cudaStream_t s);
// out[i] = bf16(x[i]) (round to nearest even), for cuBLAS inputs.
cudaError_t to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t s);
// x = hi + lo with hi = bf16(x), lo = bf16(x - hi): two bf16 GEMMs then carry ~16 mantissa bits of x.
cudaError_t to_bf16_split(const float* x, int64_t count, uint16_t* hi, uint16_t* lo, cudaStream_t s);

// Block Attention Residuals (graph::Backend::attn_res_mix; CPU reference cpu_backend.cpp): for each of n
// rows, softmax over the m = nb + 1 sources of (RMSNorm_noweight(v_i) . w), mixing the raw v_i. Sources:
// nb completed blocks [n][H] at blocks + b * block_stride, then the partial sum [n][H]. nb <= 31.
cudaError_t attn_res_mix(const float* blocks, int64_t block_stride, int nb, const float* partial, const float* w, int n,
                         int H, float eps, float* out, cudaStream_t s);

// The same mix fused with the RMSNorm that always follows it (weight norm_w): out = rmsnorm(mix) * norm_w,
// one pass, the mixed row kept in shared memory (H <= 12288).
cudaError_t attn_res_mix_rmsnorm(const float* blocks, int64_t block_stride, int nb, const float* partial, const float* w,
                                 int n, int H, float eps, const float* norm_w, float* out, cudaStream_t s);

// out[r][:] = x[rows[r]][:] for R rows of H floats.
cudaError_t gather_rows(const float* x, const int32_t* rows, int R, int H, float* out, cudaStream_t s);
// Device-to-device copies listed in device memory (one block per segment): what a captured CUDA graph can
// replay with other pointers each step (a cudaMemcpyAsync node keeps the pointers it was captured with).
struct CopySeg {
  void* dst;
  const void* src;
  uint64_t bytes;  // a multiple of 4; both pointers 4-byte aligned
};
cudaError_t copy_segments(const CopySeg* segs, int n, cudaStream_t s);

// Random weights for --load-format dummy: uniform in [-scale, scale) (bf16 bits / fp32), random bytes
// (MXFP4 nibbles), or E8M0 scales in [lo, hi]. Deterministic in `seed`.
cudaError_t fill_uniform_bf16(uint16_t* p, int64_t count, float scale, uint64_t seed, cudaStream_t s);
cudaError_t fill_uniform_f32(float* p, int64_t count, float lo, float hi, uint64_t seed, cudaStream_t s);
cudaError_t fill_random_bytes(uint8_t* p, int64_t count, uint8_t lo, uint8_t hi, uint64_t seed, cudaStream_t s);

}  // namespace k3::cuda
