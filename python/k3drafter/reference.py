"""A second, independent float64 implementation of the drafter (numpy, one block at a time, written from
docs/block-drafter.md line by line): the goldens and the tests compare the torch module against it."""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Dict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # python/

from k3ref.safetensors_io import BF16Array, read_file  # noqa: E402


def load_weights_f64(drafter_dir: str):
    """-> (config dict, {name: float64 array}) exactly as stored (BF16 expands exactly)."""
    with open(os.path.join(drafter_dir, "config.json")) as f:
        cfg = json.load(f)
    tens, _ = read_file(os.path.join(drafter_dir, "model.safetensors"))
    W = {n: (t.to_f32() if isinstance(t, BF16Array) else np.asarray(t)).astype(np.float64) for n, t in tens.items()}
    return cfg, W


def _rms(x, w, eps):
    return x / math.sqrt(float(np.mean(x * x)) + eps) * w


def _silu(z):
    return z / (1.0 + np.exp(-z))


def forward_f64(cfg: dict, W: Dict[str, np.ndarray], embed: np.ndarray, head: np.ndarray, ctx: np.ndarray,
                a: int) -> np.ndarray:
    """One draft: ctx [T*H], token a -> logits [block_size, V] (float64)."""
    eps = cfg["rms_norm_eps"]
    S, nh, hd = cfg["block_size"], cfg["num_attention_heads"], cfg["head_dim"]
    ctx = np.asarray(ctx, dtype=np.float64)
    c = _rms(W["context_proj.weight"] @ ctx, W["context_norm.weight"], eps)
    h = []
    for j in range(S):
        e = np.asarray(embed[a], dtype=np.float64) if j == 0 else W["mask_embedding"]
        x = np.concatenate([_rms(e, W["embed_norm.weight"], eps), c])
        h.append(W["input_proj.weight"] @ x + W["position_embedding"][j])
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        xs = [_rms(hj, W[p + "attn_norm.weight"], eps) for hj in h]
        q = [W[p + "q_proj.weight"] @ x for x in xs]
        k = [W[p + "k_proj.weight"] @ x for x in xs]
        v = [W[p + "v_proj.weight"] @ x for x in xs]
        for j in range(S):
            o = np.zeros(nh * hd)
            for m in range(nh):
                sl = slice(m * hd, (m + 1) * hd)
                s = [float(q[j][sl] @ k[jj][sl]) / math.sqrt(hd) for jj in range(S)]
                mx = max(s)
                ex = [math.exp(t - mx) for t in s]
                z = sum(ex)
                for jj in range(S):
                    o[sl] += ex[jj] / z * v[jj][sl]
            h[j] = h[j] + W[p + "o_proj.weight"] @ o
        for j in range(S):
            x = _rms(h[j], W[p + "mlp_norm.weight"], eps)
            g = W[p + "gate_proj.weight"] @ x
            u = W[p + "up_proj.weight"] @ x
            h[j] = h[j] + W[p + "down_proj.weight"] @ (_silu(g) * u)
    head = np.asarray(head, dtype=np.float64)
    return np.stack([head @ _rms(hj, W["final_norm.weight"], eps) for hj in h])
