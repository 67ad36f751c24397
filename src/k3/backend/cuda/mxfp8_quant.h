// MXFP8 quantisation of activation rows on the device (core/mxfp8.h's rule; mxfp8_quant.cuh's device functions).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// x [rows][cols] fp32 -> codes [rows][cols] E4M3 and scales [rows][cols / 32] E8M0 (cols % 32 == 0, else
// cudaErrorInvalidValue). One warp per 32-value block: the lanes' |x| reduced to the block's amax by shuffles.
cudaError_t quantize_mxfp8_rows(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales,
                                cudaStream_t stream);

}  // namespace k3::cuda
