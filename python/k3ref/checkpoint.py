"""Tiny random checkpoints in the exact HF schema of Kimi K3 (kimi_k3) and Kimi-Linear (kimi_linear).

Dtypes as in the real checkpoints: BF16 for projections, embeddings, norms, lm_head; F32 for the KDA
conv1d weights, dt_bias, A_log and the router's e_score_correction_bias; K3 routed experts MXFP4
(U8 weight_packed + U8 weight_scale). Deterministic for a given seed.
"""
from __future__ import annotations

import json
import math
import os
from collections import OrderedDict

import numpy as np

from . import mxfp4
from .config import parse_config
from .safetensors_io import BF16Array, write_sharded

SPECIAL_BASE_OFFSET = 256   # specials occupy the last 256 ids, as in the real vocab (163584..163839)


# compressed-tensors MXFP4 quantization_config of K3 (routed experts only), as the real checkpoint has it.
QUANT_CONFIG = OrderedDict(
    quant_method="compressed-tensors", format="mxfp4-pack-quantized", quantization_status="compressed",
    config_groups={"group_0": OrderedDict(
        targets=["Linear"], format="mxfp4-pack-quantized",
        weights=OrderedDict(num_bits=4, type="float", symmetric=True, strategy="group", group_size=32,
                            scale_dtype="uint8", zp_dtype=None, dynamic=False, observer="minmax"),
        input_activations=None, output_activations=None)},
    ignore=["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*",
            "re:.*routed_expert_(down|up)_proj.*", "re:.*block_sparse_moe\\.gate$", "lm_head",
            "re:.*vision_tower.*", "re:.*mm_projector.*"])


def save_hf_dir(dirpath: str, cfgd: dict, tensors: dict, num_shards: int, metadata=None) -> None:
    """config.json + safetensors (one file or shards + index) into dirpath, replacing stale shards."""
    os.makedirs(dirpath, exist_ok=True)
    for f in os.listdir(dirpath):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(dirpath, f))
    with open(os.path.join(dirpath, "config.json"), "w") as f:
        json.dump(cfgd, f, indent=2)
        f.write("\n")
    write_sharded(dirpath, tensors, num_shards, metadata=metadata)


def tiny_k3_config() -> dict:
    V = 1024
    text = OrderedDict(
        model_type="kimi_linear", architectures=["KimiLinearForCausalLM"],
        vocab_size=V, hidden_size=128, num_hidden_layers=8, num_attention_heads=4,
        intermediate_size=192, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=4096,
        hidden_act="situ", activation_situ_beta=4.0, activation_situ_linear_beta=25.0,
        q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        mla_use_nope=True, mla_use_output_gate=True,
        linear_attn_config=OrderedDict(kda_layers=[1, 2, 3, 5, 6], full_attn_layers=[4, 7, 8], head_dim=32,
                                       num_heads=2, short_conv_kernel_size=4, gate_lower_bound=-5.0,
                                       use_full_rank_gate=True),
        attn_res_block_size=3,
        num_experts=16, num_experts_per_token=4, num_shared_experts=2, moe_intermediate_size=64,
        routed_expert_hidden_size=64, latent_moe_use_norm=True, moe_renormalize=True,
        moe_router_activation_func="sigmoid", routed_scaling_factor=1.5, use_grouped_topk=True,
        num_expert_group=1, topk_group=1, topk_method="noaux_tc", first_k_dense_replace=1, moe_layer_freq=1,
        num_nextn_predict_layers=0, torch_dtype="bfloat16",
        bos_token_id=V - 256, eos_token_id=V - 254, pad_token_id=V - 1,
        quantization_config=QUANT_CONFIG,
    )
    return OrderedDict(
        model_type="kimi_k3", architectures=["KimiK3ForConditionalGeneration"],
        bos_token_id=V - 256, eos_token_id=V - 254, pad_token_id=V - 1,
        text_config=text,
        vision_config=OrderedDict(model_type="moonvit", note="tiny test checkpoint: no vision tensors"),
        torch_dtype="bfloat16", tie_word_embeddings=False,
    )


def tiny_kimi_linear_config() -> dict:
    V = 1024
    return OrderedDict(
        model_type="kimi_linear", architectures=["KimiLinearForCausalLM"],
        vocab_size=V, hidden_size=96, num_hidden_layers=6, num_attention_heads=3,
        num_key_value_heads=3,
        intermediate_size=160, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=4096,
        hidden_act="silu", q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, mla_use_nope=True,
        linear_attn_config=OrderedDict(kda_layers=[1, 2, 4, 5], full_attn_layers=[3, 6], head_dim=32,
                                       num_heads=3, short_conv_kernel_size=4),
        num_experts=8, num_experts_per_token=2, num_shared_experts=1, moe_intermediate_size=48,
        moe_renormalize=True, moe_router_activation_func="sigmoid", routed_scaling_factor=2.446,
        use_grouped_topk=True, num_expert_group=1, topk_group=1, first_k_dense_replace=1, moe_layer_freq=1,
        num_nextn_predict_layers=0, torch_dtype="bfloat16", use_cache=True,
        bos_token_id=V - 256, eos_token_id=V - 255, pad_token_id=V - 1,
    )


class _Gen:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def lin(self, out, inn, gain=1.0):
        return BF16Array.from_f32(self.rng.standard_normal((out, inn)) * (gain / math.sqrt(inn)))

    def norm(self, n):
        return BF16Array.from_f32(1.0 + 0.1 * self.rng.standard_normal(n))

    def f32(self, a):
        return np.asarray(a, dtype=np.float32)


def build_tensors(cfgd: dict, seed: int) -> "OrderedDict[str, object]":
    cfg = parse_config(cfgd)
    G = _Gen(seed)
    rng = G.rng
    H, V = cfg.hidden_size, cfg.vocab_size
    pre = cfg.prefix
    t: "OrderedDict[str, object]" = OrderedDict()
    t[pre + "embed_tokens.weight"] = BF16Array.from_f32(rng.standard_normal((V, H)))
    Hk, D, Kc = cfg.kda_num_heads, cfg.kda_head_dim, cfg.short_conv_kernel_size
    nh, nope, rope, vd, r = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                             cfg.v_head_dim, cfg.kv_lora_rank)
    for i in range(cfg.num_hidden_layers):
        p = f"{pre}layers.{i}."
        t[p + "input_layernorm.weight"] = G.norm(H)
        t[p + "post_attention_layernorm.weight"] = G.norm(H)
        if cfg.attn_res_block_size:
            for nm in ("self_attention_res", "mlp_res"):
                t[p + nm + "_norm.weight"] = G.norm(H)
                t[p + nm + "_proj.weight"] = G.lin(1, H, 2.0)
        a = p + "self_attn."
        if cfg.is_kda(i):
            for c in "qkv":
                t[a + f"{c}_proj.weight"] = G.lin(Hk * D, H)
            for c in "qkv":
                w = 0.4 * rng.standard_normal((Hk * D, 1, Kc))
                w[..., -1] += 0.8                    # current-token tap dominant, like trained convs
                t[a + f"{c}_conv1d.weight"] = G.f32(w)
            t[a + "f_a_proj.weight"] = G.lin(D, H)
            t[a + "f_b_proj.weight"] = G.lin(Hk * D, D, 0.5)
            if cfg.gate_lower_bound is not None:
                # g = -5 sigmoid(exp(A) z): z around -2.5..-5 gives per-step decays ~0.5..0.98
                t[a + "dt_bias"] = G.f32(rng.uniform(-5.0, -2.5, Hk * D))
                A = np.zeros(128, dtype=np.float32)   # K3 layout: [128], zero-padded past the first Hk
                A[:Hk] = np.log(rng.uniform(0.6, 1.4, Hk))
                t[a + "A_log"] = A
            else:
                # g = -exp(A) softplus(z): softplus(z) ~0.05..0.7, exp(A) ~0.3..1
                t[a + "dt_bias"] = G.f32(rng.uniform(-3.0, -0.3, Hk * D))
                t[a + "A_log"] = G.f32(np.log(rng.uniform(0.3, 1.0, (1, 1, Hk, 1))))
            t[a + "b_proj.weight"] = G.lin(Hk, H)
            if cfg.use_full_rank_gate:
                t[a + "g_proj.weight"] = G.lin(Hk * D, H)
            else:
                t[a + "g_a_proj.weight"] = G.lin(D, H)
                t[a + "g_b_proj.weight"] = G.lin(Hk * D, D)
            t[a + "o_norm.weight"] = G.norm(D)
            t[a + "o_proj.weight"] = G.lin(H, Hk * D)
        else:
            if cfg.q_lora_rank:
                t[a + "q_a_proj.weight"] = G.lin(cfg.q_lora_rank, H)
                t[a + "q_a_layernorm.weight"] = G.norm(cfg.q_lora_rank)
                t[a + "q_b_proj.weight"] = G.lin(nh * (nope + rope), cfg.q_lora_rank)
            else:
                t[a + "q_proj.weight"] = G.lin(nh * (nope + rope), H)
            t[a + "kv_a_proj_with_mqa.weight"] = G.lin(r + rope, H)
            t[a + "kv_a_layernorm.weight"] = G.norm(r)
            t[a + "kv_b_proj.weight"] = G.lin(nh * (nope + vd), r)
            t[a + "o_proj.weight"] = G.lin(H, nh * vd)
            if cfg.mla_use_output_gate:
                t[a + "g_proj.weight"] = G.lin(nh * vd, H)
        if not cfg.is_moe(i):
            m = p + "mlp."
            t[m + "gate_proj.weight"] = G.lin(cfg.intermediate_size, H)
            t[m + "up_proj.weight"] = G.lin(cfg.intermediate_size, H)
            t[m + "down_proj.weight"] = G.lin(H, cfg.intermediate_size)
            continue
        m = p + "block_sparse_moe."
        E, I = cfg.num_experts, cfg.moe_intermediate_size
        t[m + "gate.weight"] = G.lin(E, H, 1.5)
        t[m + "gate.e_score_correction_bias"] = G.f32(rng.uniform(-0.15, 0.15, E))
        X = cfg.routed_expert_hidden_size or H
        for e in range(E):
            for wn, (o, ii) in (("w1", (I, X)), ("w3", (I, X)), ("w2", (X, I))):
                if cfg.mxfp4_experts:
                    w = rng.standard_normal((o, ii)) / math.sqrt(ii)
                    pk, sc = mxfp4.quantize(w)
                    t[m + f"experts.{e}.{wn}.weight_packed"] = pk
                    t[m + f"experts.{e}.{wn}.weight_scale"] = sc
                else:
                    t[m + f"experts.{e}.{wn}.weight"] = G.lin(o, ii)
        if cfg.num_shared_experts:
            Is = I * cfg.num_shared_experts
            t[m + "shared_experts.gate_proj.weight"] = G.lin(Is, H)
            t[m + "shared_experts.up_proj.weight"] = G.lin(Is, H)
            t[m + "shared_experts.down_proj.weight"] = G.lin(H, Is)
        if cfg.routed_expert_hidden_size:
            t[m + "routed_expert_down_proj.weight"] = G.lin(X, H)
            if cfg.latent_moe_use_norm:
                t[m + "routed_expert_norm.weight"] = G.norm(X)
            t[m + "routed_expert_up_proj.weight"] = G.lin(H, X)
    if cfg.attn_res_block_size:
        t[pre + "output_attn_res_norm.weight"] = G.norm(H)
        t[pre + "output_attn_res_proj.weight"] = G.lin(1, H, 2.0)
    t[pre + "norm.weight"] = G.norm(H)
    t[cfg.head_name] = G.lin(V, H, 2.0)
    return t


def write_checkpoint(dirpath: str, cfgd: dict, seed: int, num_shards: int) -> None:
    tensors = build_tensors(cfgd, seed)
    save_hf_dir(dirpath, cfgd, tensors, num_shards, metadata={"format": "pt"} if num_shards <= 1 else None)
