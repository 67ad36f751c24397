"""MXFP4 (OCP microscaling, compressed-tensors "mxfp4-pack-quantized") as stored in Kimi K3 routed experts.

weight_packed U8 [out, in/2]: element 2i in the low nibble, 2i+1 in the high nibble; nibble = FP4 E2M1
(bit 3 sign, bits 0-2 index into E2M1_VALUES). weight_scale U8 [out, in/32]: E8M0, 2^(s-127).

Quantiser (model-spec section 4): per group of 32 inputs, s = floor(log2(amax)) - 2 + 127 (amax maps into
[4, 8)), clamped to [0, 254]; each value x / 2^(s-127) rounds to the nearest E2M1 value, ties to the even
code (round-half-even on the 3-bit magnitude code), saturating at 6. Zeros (and values that round to 0) are
stored as +0 (nibble 0). An all-zero group gets scale byte 127 (2^0) and all-zero nibbles.
"""
from __future__ import annotations

import numpy as np

E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
GROUP = 32


def _round_e2m1_code(a: np.ndarray) -> np.ndarray:
    """a >= 0 (already divided by the scale); returns the magnitude code 0..7 (nearest, ties to even code)."""
    a = np.minimum(a, 6.0)
    # distance to every representable value; pick the minimum, ties -> even code
    d = np.abs(a[..., None] - E2M1_VALUES)
    best = d.min(axis=-1, keepdims=True)
    cand = d == best
    codes = np.arange(8)
    # prefer the even code among ties: score = code, plus 8 for odd codes
    score = np.where(cand, codes + 8 * (codes % 2), 1 << 10)
    return score.argmin(axis=-1).astype(np.uint8)


def quantize(w: np.ndarray):
    """w float [out, in] (in % 32 == 0) -> (packed U8 [out, in/2], scale U8 [out, in/32])."""
    w = np.asarray(w, dtype=np.float64)
    out, inn = w.shape
    if inn % GROUP:
        raise ValueError(f"MXFP4: input dim {inn} not a multiple of {GROUP}")
    g = w.reshape(out, inn // GROUP, GROUP)
    amax = np.abs(g).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2
    s = np.where(amax > 0, e + 127, 127).clip(0, 254).astype(np.int64)
    x = g / np.exp2(s - 127)[..., None].astype(np.float64)
    code = _round_e2m1_code(np.abs(x))
    sign = ((x < 0) & (code > 0)).astype(np.uint8)
    nib = (code | (sign << 3)).reshape(out, inn)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed, s.astype(np.uint8)


def dequantize(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(packed U8 [out, in/2], scale U8 [out, in/32]) -> float64 [out, in]."""
    packed = np.asarray(packed, dtype=np.uint8)
    out, half = packed.shape
    inn = half * 2
    if scale.shape != (out, inn // GROUP):
        raise ValueError(f"MXFP4: scale shape {scale.shape} does not match packed {packed.shape}")
    nib = np.empty((out, inn), dtype=np.uint8)
    nib[:, 0::2] = packed & 0xF
    nib[:, 1::2] = packed >> 4
    mag = E2M1_VALUES[nib & 7]
    val = np.where(nib & 8, -mag, mag)
    sc = np.exp2(scale.astype(np.float64) - 127.0)
    return (val.reshape(out, inn // GROUP, GROUP) * sc[..., None]).reshape(out, inn)
