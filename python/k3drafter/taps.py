"""The target's taps (docs/block-drafter.md, "What the target provides"): for tap id l < num_layers the normed
mixer input `xin` of layer l, for l == num_layers the final-normed hidden.

Two sources over the same checkpoint: python/k3ref (the reference, one sequence, float64 for goldens) and
python/k3tiny/model_train.K3Tiny (batched, GPU, for the training data). tests/test_taps.py checks they agree.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # python/


def load_reference(target_dir: str, dtype=torch.float64):
    from k3ref.model import load_model
    return load_model(target_dir, dtype=dtype)


def taps_reference(model, tokens: Sequence[int], tap_ids: Sequence[int]) -> torch.Tensor:
    """k3ref forward of one fresh sequence -> [n_tokens, len(tap_ids), H] in the model's dtype."""
    got = dict.fromkeys(tap_ids)
    model.forward(list(tokens), kda_mode="chunk", taps=got)
    return torch.stack([got[l] for l in tap_ids], 1)


def load_fast(target_dir: str, device="cpu", ref=None):
    """The batched trainable model (float32) with the checkpoint's weights (MXFP4 experts dequantised by
    k3ref, exactly the values the reference uses); eval mode, no gradients."""
    from k3tiny.model_train import K3Tiny
    ref = ref if ref is not None else load_reference(target_dir, dtype=torch.float32)
    m = K3Tiny(ref.cfg)
    m.load_hf_tensors(ref.w)
    m.to(device).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@torch.no_grad()
def taps_fast(model, ids: torch.Tensor, tap_ids: Sequence[int]) -> torch.Tensor:
    """ids [B, T] -> [B, T, len(tap_ids), H] float32 (no lm_head is run)."""
    got = dict.fromkeys(tap_ids)
    model(ids, taps=got, head=False)
    return torch.stack([got[l] for l in tap_ids], 2)
