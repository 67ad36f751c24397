// MXFP8 (OCP Microscaling Formats v1.0, "MXFP8 E4M3"): blocks of 32 values sharing one E8M0 scale byte s
// (the power of two 2^(s-127)); each value an FP8 E4M3 code (cache_dtype.h's e4m3fn: max 448, NaN 0x7F).
// K3 was trained quantisation-aware with MXFP8 activations into its MXFP4 experts (model-spec section 4);
// `--moe-activation-dtype mxfp8` (moe_activation.h) rounds the routed experts' inputs to it (docs/quantization.md). These host
// functions define the numerics: the CPU backend's fake quantisation and the CUDA kernels that multiply
// MXFP4 weights by MXFP8 activations must give the same scale bytes and codes.
//
// The scale rule: amax = max |x_i| over the block, NaN ignored (as fmaxf ignores it); then
//   amax == 0 (also: every value NaN)  -> s = 0 (2^-127)
//   otherwise                           -> e = floor(log2(amax)) - 8, clamped to [-127, 127], s = e + 127
// (8 = E4M3's largest exponent: 448 = 1.75 * 2^8, so amax / 2^e lies in [256, 512) and at most the top
// binade saturates to 448, as the OCP spec's conversion does.) floor(log2) is the exact float exponent
// (std::frexp), float subnormals included.
//
// Non-finite inputs (decided here; the CUDA path must do the same):
//   +-inf in a block: amax = inf, floor(log2(inf)) clamps to e = 127, s = 254. The inf's code saturates to
//     +-448 (0x7E / 0xFE) and dequantises to 448 * 2^127, which overflows float to +-inf: an overflow stays
//     visible. The block's finite values are rounded on that block's grid (steps of 2^118): in practice +-0.
//   NaN: code 0x7F, dequantised NaN; it does not enter amax, so the rest of its block is unaffected.
#pragma once
#include <cstdint>

namespace k3 {

inline constexpr int kMxBlock = 32;  // values per shared scale

// The E8M0 scale byte of the n values x[0..n) (n >= 1; a full block has 32, a row's short last block fewer).
uint8_t mxfp8_block_scale(const float* x, int n);

// x[0..n) as MXFP8: codes[i] = E4M3 of x[i] / 2^(s-127) (round to nearest even, saturating to +-448 as
// f32_to_fp8_e4m3 does), scales[b] = block b's scale byte. n % 32 == 0, else k3::Error.
void quantize_mxfp8(const float* x, int64_t n, uint8_t* codes, uint8_t* scales);

// In place: x[i] <- E4M3 value of its code * 2^(s-127), exact in float (quantise then dequantise).
// n % 32 == 0, else k3::Error.
void fake_quant_mxfp8(float* x, int64_t n);

// fake_quant_mxfp8 over a row of any width n >= 0: the full blocks from the row's start, then a short last block
// of n % 32 values scaled by its own amax, which is the same as padding it with zeros to 32 (zeros change neither
// the amax nor the other codes). What the CPU backend applies to each expert input row.
void fake_quant_mxfp8_row(float* x, int64_t n);

}  // namespace k3
