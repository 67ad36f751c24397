// MXFP8 quantisation of activation rows on the device (core/mxfp8.h's rule; mxfp8_quant.cuh's device functions).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// x [rows][cols] fp32 -> codes [rows][cols] E4M3 and scales [rows][cols / 32] E8M0 (cols % 32 == 0, else
// cudaErrorInvalidValue). One warp per 32-value block: the lanes' |x| reduced to the block's amax by shuffles.
cudaError_t quantize_mxfp8_rows(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales,
                                cudaStream_t stream);

// out[r][c] = x[r][c] rounded to MXFP8 and back (core/mxfp8.h fake_quant_mxfp8_row on each row: blocks of 32 from the
// row's start, a short last block of cols % 32 on its own amax), bit for bit the host's; out may be x (in place).
// cols >= 1, rows >= 0, else cudaErrorInvalidValue. One warp per block. MoePrecision::Mxfp8's tile form rounds the
// expert inputs and the GLU outputs with it, so the bf16 tensor-core tiles see exact MXFP8 values (an E4M3 value times
// a power of two is a bf16 value).
cudaError_t fake_quant_mxfp8_rows(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace k3::cuda
