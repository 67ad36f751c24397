// Tensor-core absorbed MLA decode (used by mla_attend_latent in mla_kernels.cu; not a public entry point).
// Shapes: kv_lora_rank 512, rope 64 (row 576 values) only; rows of every cache dtype (mla_row_loader.cuh);
// bf16 operands, fp32 softmax and accumulators.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "k3/backend/cuda/mla_kernels.h"

namespace k3::cuda::mla_tc {

constexpr int kCd = 576;  // latent row: kv_lora_rank 512 + rope 64
constexpr int kKr = 512;
constexpr int kHeadsPerBlock = 32;
// A split is never shorter than this many keys, so short contexts use few splits (the merge reads
// nh x splits x 2 KB; below ~nh keys per split that would outweigh the rows themselves).
constexpr int kMinSplitKeys = 128;

bool supports(int kr, int dr);
// Key splits for N tokens of nh heads over rows of `dtype`: the fewest that keep the SMs' waves (at the
// kernel's resident blocks per SM for that dtype) within 5% of even, at most one per SM and at most 4
// blocks per resident slot in all. Depends on N, nh and dtype only (CUDA graphs).
int splits(int N, int nh, CacheDType dtype);
// The largest split workspace over the dtypes.
size_t workspace_floats(int N, int nh, int kr);
cudaError_t attend(const MlaPaging& pg, int N, int nh, const float* q_lat, float scale, float* o_lat, float* ws,
                   cudaStream_t s);

}  // namespace k3::cuda::mla_tc

namespace k3::cuda::mla_detail {

// Keys per split for a sequence of `len` keys cut into at most `ns` splits of at least `min_keys` keys,
// rounded up to `gran`; split sp covers [sp * chunk, min(len, (sp + 1) * chunk)), and only the first
// ceil(len / chunk) splits exist (the others write nothing and the merge skips them).
__host__ __device__ inline int split_chunk(int len, int ns, int min_keys, int gran) {
  int c = (len + ns - 1) / ns;
  if (c < min_keys) c = min_keys;
  return (c + gran - 1) / gran * gran;
}

// The split rule of both tensor-core kernels: `per` blocks per split (tokens x head blocks) over `slots`
// resident blocks; the fewest splits (at most max_splits, and at most 4 blocks per slot in all) whose
// waves come within 5% of the even spread (fewer splits: less merge traffic), else the best seen.
int even_splits(int64_t per, int slots, int max_splits);

// Merges the splits' (max, sum, unnormalised o) of ws [N][nh][ns][kr + 2] into o_lat (mla_kernels.cu).
cudaError_t merge_splits(const MlaPaging& pg, int N, int nh, int kr, int ns, int min_keys, int gran, const float* ws,
                         float* o_lat, cudaStream_t s);

}  // namespace k3::cuda::mla_detail
