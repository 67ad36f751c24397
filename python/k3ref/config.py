"""Parse an HF config.json of either variant (kimi_linear flat, kimi_k3 with text_config) into one dataclass."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class K3Config:
    model_type: str                 # top-level model_type: "kimi_k3" or "kimi_linear"
    prefix: str                     # tensor name prefix of the language model: "language_model.model." / "model."
    head_name: str                  # lm_head tensor name
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    activation_situ_beta: float
    activation_situ_linear_beta: float
    # MLA
    q_lora_rank: Optional[int]
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_use_output_gate: bool
    # KDA
    kda_layers: List[int]           # 1-based
    full_attn_layers: List[int]     # 1-based
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    gate_lower_bound: Optional[float]   # None -> Kimi-Linear gate -exp(A_log)*softplus(z)
    use_full_rank_gate: bool
    # residual
    attn_res_block_size: Optional[int]  # None -> plain pre-norm residual
    # MoE
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    routed_expert_hidden_size: Optional[int]   # None -> experts at full width (Kimi-Linear)
    latent_moe_use_norm: bool
    moe_renormalize: bool
    moe_router_activation_func: str
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int
    tie_word_embeddings: bool
    # quantisation of routed experts
    mxfp4_experts: bool
    mxfp4_group_size: int
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    raw: dict = field(default_factory=dict, repr=False)

    # ---- derived helpers
    @property
    def is_k3(self) -> bool:
        return self.model_type == "kimi_k3"

    def is_kda(self, i: int) -> bool:
        """Layer i (0-based) is KDA iff i+1 is in kda_layers."""
        return (i + 1) in self.kda_layers

    def is_moe(self, i: int) -> bool:
        return i >= self.first_k_dense_replace and (i - self.first_k_dense_replace) % self.moe_layer_freq == 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def _req(d: dict, key: str):
    if key not in d:
        raise KeyError(f"config.json: required field '{key}' missing")
    return d[key]


def parse_config(cfg: dict) -> K3Config:
    top = cfg
    mt = _req(top, "model_type")
    if mt == "kimi_k3":
        tc = _req(top, "text_config")
        prefix, head = "language_model.model.", "language_model.lm_head.weight"
    elif mt == "kimi_linear":
        tc = top
        prefix, head = "model.", "lm_head.weight"
    else:
        raise ValueError(f"config.json: unsupported model_type {mt!r}")
    lac = _req(tc, "linear_attn_config")
    qc = tc.get("quantization_config") or top.get("quantization_config")
    mxfp4 = False
    gsize = 32
    if qc is not None:
        if qc.get("quant_method") != "compressed-tensors":
            raise ValueError(f"unsupported quant_method {qc.get('quant_method')!r}")
        fmt = qc.get("format")
        groups = qc.get("config_groups", {})
        for g in groups.values():
            w = g.get("weights", {}) or {}
            if w.get("group_size"):
                gsize = int(w["group_size"])
            fmt = g.get("format", fmt)
        if fmt != "mxfp4-pack-quantized":
            raise ValueError(f"unsupported quantization format {fmt!r}")
        mxfp4 = True

    def tok(name):
        v = top.get(name, tc.get(name))
        if isinstance(v, list):
            v = v[0] if v else None
        return v

    act = tc.get("hidden_act", "silu")
    if act not in ("silu", "situ"):
        raise ValueError(f"unsupported hidden_act {act!r}")
    return K3Config(
        model_type=mt, prefix=prefix, head_name=head,
        vocab_size=int(_req(tc, "vocab_size")),
        hidden_size=int(_req(tc, "hidden_size")),
        num_hidden_layers=int(_req(tc, "num_hidden_layers")),
        num_attention_heads=int(_req(tc, "num_attention_heads")),
        intermediate_size=int(_req(tc, "intermediate_size")),
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-5)),
        hidden_act=act,
        activation_situ_beta=float(tc.get("activation_situ_beta", 4.0)),
        activation_situ_linear_beta=float(tc.get("activation_situ_linear_beta", 25.0)),
        q_lora_rank=tc.get("q_lora_rank"),
        kv_lora_rank=int(_req(tc, "kv_lora_rank")),
        qk_nope_head_dim=int(_req(tc, "qk_nope_head_dim")),
        qk_rope_head_dim=int(_req(tc, "qk_rope_head_dim")),
        v_head_dim=int(_req(tc, "v_head_dim")),
        mla_use_output_gate=bool(tc.get("mla_use_output_gate", False)),
        kda_layers=list(_req(lac, "kda_layers")),
        full_attn_layers=list(_req(lac, "full_attn_layers")),
        kda_num_heads=int(_req(lac, "num_heads")),
        kda_head_dim=int(_req(lac, "head_dim")),
        short_conv_kernel_size=int(lac.get("short_conv_kernel_size", 4)),
        gate_lower_bound=lac.get("gate_lower_bound"),
        use_full_rank_gate=bool(lac.get("use_full_rank_gate", False)),
        attn_res_block_size=tc.get("attn_res_block_size"),
        num_experts=int(_req(tc, "num_experts")),
        num_experts_per_token=int(_req(tc, "num_experts_per_token")),
        num_shared_experts=int(tc.get("num_shared_experts", 0)),
        moe_intermediate_size=int(_req(tc, "moe_intermediate_size")),
        routed_expert_hidden_size=tc.get("routed_expert_hidden_size"),
        latent_moe_use_norm=bool(tc.get("latent_moe_use_norm", False)),
        moe_renormalize=bool(tc.get("moe_renormalize", True)),
        moe_router_activation_func=tc.get("moe_router_activation_func", "sigmoid"),
        routed_scaling_factor=float(tc.get("routed_scaling_factor", 1.0)),
        first_k_dense_replace=int(tc.get("first_k_dense_replace", 0)),
        moe_layer_freq=int(tc.get("moe_layer_freq", 1)),
        tie_word_embeddings=bool(tc.get("tie_word_embeddings", top.get("tie_word_embeddings", False))),
        mxfp4_experts=mxfp4, mxfp4_group_size=gsize,
        bos_token_id=tok("bos_token_id"), eos_token_id=tok("eos_token_id"), pad_token_id=tok("pad_token_id"),
        raw=cfg,
    )


def load_config(path: str) -> K3Config:
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        return parse_config(json.load(f))
