"""K3BlockDrafter in PyTorch: the arithmetic of docs/block-drafter.md, its config and its HF-style directory.

One forward reads, per draft, the target's taps `ctx` [T*H] (the row whose logits produced token `a`) and
`a`, and returns logits for all `block_size` block positions at once (the block attends in both directions,
so it always has all positions). The target's embedding table and lm_head are frozen buffers of the module,
never saved with it (the engine takes them from the loaded target).

Precision: run the module in float64 (`.double()`, float64 inputs) for goldens, float32 for checks, or
float32 under bf16 autocast for training. The norms and the residual stream are always computed in float32
(float64 for a float64 module), so autocast only lowers the matmuls and the attention.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # python/

from k3ref.safetensors_io import BF16Array, read_file, write_file  # noqa: E402

ARCH = "K3BlockDrafter"
MODEL_TYPE = "k3_block_drafter"


@dataclass
class DrafterConfig:
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 768
    block_size: int = 8
    target_layer_ids: List[int] = field(default_factory=lambda: [2, 6, 10, 12])
    rms_norm_eps: float = 1e-5
    target_hidden_size: int = 256
    target_vocab_size: int = 8192
    target_num_layers: int = 12

    def validate(self) -> "DrafterConfig":
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(f"drafter hidden_size {self.hidden_size} != target_hidden_size {self.target_hidden_size}")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty")
        for l in self.target_layer_ids:
            if not 0 <= l <= self.target_num_layers:
                raise ValueError(f"tap id {l} outside [0, {self.target_num_layers}]")
        if min(self.block_size, self.num_hidden_layers, self.num_attention_heads, self.head_dim,
               self.intermediate_size) < 1:
            raise ValueError(f"non-positive size in {self}")
        return self

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    def to_json(self) -> dict:
        d = {"architectures": [ARCH], "model_type": MODEL_TYPE}
        d.update({f.name: getattr(self, f.name) for f in fields(self)})
        d["target_layer_ids"] = list(self.target_layer_ids)
        d["torch_dtype"] = "bfloat16"
        return d

    @staticmethod
    def from_json(d: dict) -> "DrafterConfig":
        if d.get("model_type") != MODEL_TYPE or ARCH not in d.get("architectures", []):
            raise ValueError(f"not a {ARCH} config: model_type={d.get('model_type')!r}")
        kw = {f.name: d[f.name] for f in fields(DrafterConfig)}
        kw["target_layer_ids"] = [int(x) for x in kw["target_layer_ids"]]
        return DrafterConfig(**kw).validate()

    def matches_target(self, hidden: int, vocab: int, layers: int) -> None:
        got = (self.target_hidden_size, self.target_vocab_size, self.target_num_layers)
        if got != (hidden, vocab, layers):
            raise ValueError(f"drafter made for a target with (hidden, vocab, layers) = {got}, "
                             f"the target has {(hidden, vocab, layers)}")


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """rms(x, w) = x / sqrt(mean(x^2) + eps) * w, in float32 (float64 for float64 x) even under autocast."""
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.to(dt)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.to(dt)


class Norm(nn.Module):
    """Holds `<name>.weight` like the file; the arithmetic is rms()."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.weight, self.eps)


def _lin(i: int, o: int) -> nn.Linear:
    return nn.Linear(i, o, bias=False)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H, nh, hd, I, eps = (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size,
                             cfg.rms_norm_eps)
        self.nh, self.hd = nh, hd
        self.attn_norm = Norm(H, eps)
        self.q_proj, self.k_proj, self.v_proj = _lin(H, nh * hd), _lin(H, nh * hd), _lin(H, nh * hd)
        self.o_proj = _lin(nh * hd, H)
        self.mlp_norm = Norm(H, eps)
        self.gate_proj, self.up_proj = _lin(H, I), _lin(H, I)
        self.down_proj = _lin(I, H)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, S, H] (float32/64 residual stream) -> h after the layer."""
        B, S, _ = h.shape
        x = self.attn_norm(h)

        def heads(t):   # [B, S, nh*hd] -> [B, nh, S, hd]; head m owns columns m*hd .. m*hd+hd-1
            return t.reshape(B, S, self.nh, self.hd).transpose(1, 2)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        # No mask: every block position attends to every other (the block is not causal). Default scale
        # 1/sqrt(hd) as in the contract.
        o = F.scaled_dot_product_attention(q, k, v)
        h = h + self.o_proj(o.transpose(1, 2).reshape(B, S, self.nh * self.hd)).to(h.dtype)
        x = self.mlp_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)).to(h.dtype)


class K3BlockDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, target_embed: Optional[torch.Tensor] = None,
                 target_head: Optional[torch.Tensor] = None):
        super().__init__()
        self.cfg = cfg.validate()
        H, T, eps = cfg.hidden_size, cfg.n_taps, cfg.rms_norm_eps
        self.context_proj = _lin(T * H, H)
        self.context_norm = Norm(H, eps)
        self.embed_norm = Norm(H, eps)
        self.mask_embedding = nn.Parameter(torch.zeros(H))
        self.input_proj = _lin(2 * H, H)
        self.position_embedding = nn.Parameter(torch.zeros(cfg.block_size, H))
        self.layers = nn.ModuleList([DrafterLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.final_norm = Norm(H, eps)
        # The target's tables: frozen, moved with the module, not part of state_dict / the saved file.
        self.register_buffer("target_embed", torch.zeros(0, H), persistent=False)
        self.register_buffer("target_head", torch.zeros(0, H), persistent=False)
        self.reset_parameters()
        if target_embed is not None:
            self.set_target(target_embed, target_head)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0):
        """Matrices N(0, 1/fan_in), the output projections of each layer further x 1/sqrt(2L) (the residual
        stream starts near the input_proj output); norms 1; mask_embedding N(0, 1) (only its direction
        matters, embed_norm rescales it); position_embedding N(0, 0.2^2) so block positions differ from
        step 0 without swamping the input."""
        g = torch.Generator().manual_seed(seed)
        out_scale = 1.0 / math.sqrt(2 * self.cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "mask_embedding":
                p.copy_(torch.randn(p.shape, generator=g))
            elif name == "position_embedding":
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif name.endswith("proj.weight"):
                std = 1.0 / math.sqrt(p.shape[1])
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    std *= out_scale
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                raise RuntimeError(f"no init rule for {name}")

    def set_target(self, embed: torch.Tensor, head: torch.Tensor):
        V, H = self.cfg.target_vocab_size, self.cfg.hidden_size
        if tuple(embed.shape) != (V, H) or tuple(head.shape) != (V, H):
            raise ValueError(f"target embed {tuple(embed.shape)} / head {tuple(head.shape)}, want {(V, H)}")
        dev = self.context_proj.weight.device
        dt = self.context_proj.weight.dtype
        self.target_embed = embed.detach().to(dev, dt).contiguous()
        self.target_head = head.detach().to(dev, dt).contiguous()
        return self

    # -- forward
    def hidden(self, ctx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """ctx [B, T*H], tok [B] -> final-normed hidden [B, block_size, H] (the lm_head input)."""
        cfg = self.cfg
        B, H, S = ctx.shape[0], cfg.hidden_size, cfg.block_size
        if self.target_embed.shape[0] == 0:
            raise RuntimeError("no target tables: call set_target(embed, head)")
        c = self.context_norm(self.context_proj(ctx))                                   # [B, H]
        e0 = self.target_embed[tok].unsqueeze(1)                                        # [B, 1, H]
        e = torch.cat([e0, self.mask_embedding.to(e0.dtype).expand(B, S - 1, H)], 1)   # [B, S, H]
        en = self.embed_norm(e)
        x = torch.cat([en, c.unsqueeze(1).expand(B, S, H)], -1)                         # [B, S, 2H]
        h = self.input_proj(x).to(en.dtype) + self.position_embedding.to(en.dtype)
        for layer in self.layers:
            h = layer(h)
        return self.final_norm(h)

    def forward(self, ctx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """-> logits [B, block_size, V]."""
        return F.linear(self.hidden(ctx, tok), self.target_head)

    # -- files
    @torch.no_grad()
    def round_matrices_to_bf16_(self):
        """Rounds the matrices in place exactly as save_dir stores them (nearest even), so the module equals
        what from_dir reads back."""
        for name, p in self.named_parameters():
            if is_matrix(name):
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
        return self

    def file_tensors(self) -> Dict[str, object]:
        out = {}
        for name, p in self.state_dict().items():
            a = p.detach().to("cpu", torch.float32).numpy()
            out[name] = BF16Array.from_f32(a) if is_matrix(name) else np.ascontiguousarray(a, dtype=np.float32)
        return out

    def save_dir(self, path: str):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(self.cfg.to_json(), f, indent=1)
            f.write("\n")
        write_file(os.path.join(path, "model.safetensors"), self.file_tensors(), {"format": "pt"})

    @staticmethod
    def from_dir(path: str, target: Union[None, str, Tuple[torch.Tensor, torch.Tensor]] = None,
                 dtype=torch.float32, device="cpu") -> "K3BlockDrafter":
        """target: None, a target checkpoint directory, or (embed [V,H], lm_head [V,H])."""
        with open(os.path.join(path, "config.json")) as f:
            cfg = DrafterConfig.from_json(json.load(f))
        m = K3BlockDrafter(cfg)
        tens, _ = read_file(os.path.join(path, "model.safetensors"))
        sd = m.state_dict()
        if set(tens) != set(sd):
            raise ValueError(f"{path}: tensors missing {sorted(set(sd) - set(tens))}, "
                             f"unexpected {sorted(set(tens) - set(sd))}")
        new = {}
        for name, t in tens.items():
            a = t.to_f32() if isinstance(t, BF16Array) else np.asarray(t, dtype=np.float32)
            if tuple(a.shape) != tuple(sd[name].shape):
                raise ValueError(f"{path}: {name} has shape {a.shape}, want {tuple(sd[name].shape)}")
            new[name] = torch.from_numpy(a.copy())
        m.load_state_dict(new)
        m.to(device, dtype)
        if target is not None:
            if isinstance(target, str):
                tcfg, embed, head = load_target_tables(target)
                cfg.matches_target(tcfg.hidden_size, tcfg.vocab_size, tcfg.num_hidden_layers)
            else:
                embed, head = target
            m.set_target(embed, head)
        return m


def is_matrix(name: str) -> bool:
    """The projections are BF16 in the file; norms, mask_embedding and position_embedding are F32."""
    return name.endswith("proj.weight")


def load_target_tables(target_dir: str):
    """-> (K3Config, embed [V,H] float32, lm_head [V,H] float32) of a target checkpoint directory, exactly
    the stored values (BF16 expands exactly)."""
    from k3ref.config import load_config
    from k3ref.safetensors_io import load_dir
    cfg = load_config(target_dir)
    tens = load_dir(target_dir)
    emb_name = cfg.prefix + "embed_tokens.weight"
    head_name = emb_name if cfg.tie_word_embeddings else cfg.head_name

    def f32(t):
        return torch.from_numpy(np.ascontiguousarray(t.to_f32() if isinstance(t, BF16Array) else t, dtype=np.float32))
    return cfg, f32(tens[emb_name]), f32(tens[head_name])
