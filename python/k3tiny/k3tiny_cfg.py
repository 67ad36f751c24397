"""k3-tiny config: builds the kimi_k3 HF config.json dict (same format as python/k3ref/checkpoint.py writes)."""
from __future__ import annotations

import json
import os
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # python/ (k3ref)

from k3ref.config import parse_config  # noqa: E402

from k3ref.checkpoint import QUANT_CONFIG  # noqa: E402,F401  (one copy, shared with the tiny checkpoints)


def make_config(V=8192, H=256, L=12, full_attn_every=4, attn_res_block=4, kda_heads=2, kda_dim=64,
                mla_heads=4, q_lora=128, kv_lora=64, nope=32, rope=16, vdim=32, dense_inter=512,
                E=32, topk=4, shared=1, moe_inter=96, latent=128, scale=2.0, mxfp4=True,
                max_pos=4096) -> dict:
    full = sorted(set(list(range(full_attn_every, L + 1, full_attn_every)) + [L]))
    kda = [i for i in range(1, L + 1) if i not in full]
    text = OrderedDict(
        model_type="kimi_linear", architectures=["KimiLinearForCausalLM"],
        vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=mla_heads,
        intermediate_size=dense_inter, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=max_pos,
        hidden_act="situ", activation_situ_beta=4.0, activation_situ_linear_beta=25.0,
        q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=vdim,
        mla_use_nope=True, mla_use_output_gate=True,
        linear_attn_config=OrderedDict(kda_layers=kda, full_attn_layers=full, head_dim=kda_dim,
                                       num_heads=kda_heads, short_conv_kernel_size=4, gate_lower_bound=-5.0,
                                       use_full_rank_gate=True),
        attn_res_block_size=attn_res_block,
        num_experts=E, num_experts_per_token=topk, num_shared_experts=shared, moe_intermediate_size=moe_inter,
        routed_expert_hidden_size=latent, latent_moe_use_norm=True, moe_renormalize=True,
        moe_router_activation_func="sigmoid", routed_scaling_factor=scale, use_grouped_topk=True,
        num_expert_group=1, topk_group=1, topk_method="noaux_tc", first_k_dense_replace=1, moe_layer_freq=1,
        num_nextn_predict_layers=0, torch_dtype="bfloat16",
        bos_token_id=V - 256, eos_token_id=V - 254, pad_token_id=V - 1,
    )
    if mxfp4:
        text["quantization_config"] = json.loads(json.dumps(QUANT_CONFIG))
    return OrderedDict(
        model_type="kimi_k3", architectures=["KimiK3ForConditionalGeneration"],
        bos_token_id=V - 256, eos_token_id=V - 254, pad_token_id=V - 1,
        text_config=text,
        vision_config=OrderedDict(model_type="moonvit", note="k3-tiny: text only, no vision tensors"),
        torch_dtype="bfloat16", tie_word_embeddings=False,
    )


def tiny_test_config(mxfp4=True) -> dict:
    """Small config for CPU tests (every feature on)."""
    return make_config(V=512, H=64, L=6, full_attn_every=3, attn_res_block=2, kda_heads=2, kda_dim=32,
                       mla_heads=2, q_lora=32, kv_lora=32, nope=16, rope=8, vdim=16, dense_inter=96,
                       E=8, topk=2, shared=1, moe_inter=32, latent=32, scale=2.0, mxfp4=mxfp4)


def load_json(path):
    with open(path) as f:
        return json.load(f, object_pairs_hook=OrderedDict)


def without_quant(cfgd: dict) -> dict:
    c = json.loads(json.dumps(cfgd), object_pairs_hook=OrderedDict)
    c["text_config"].pop("quantization_config", None)
    return c


def predicted_size(cfgd: dict) -> dict:
    """Bytes of model.safetensors (data only; the header adds a few tens of KB) and param counts."""
    import torch
    from k3tiny.model_train import K3Tiny, count_params
    cfg = parse_config(cfgd)
    m = _build_meta(cfg)
    c = count_params(m)
    f32 = 0
    for name, p in m.named_parameters():
        if "conv1d" in name or name.endswith("dt_bias") or name.endswith("A_log"):
            f32 += p.numel()
    f32 += sum(mm.gate.e_score_correction_bias.numel() for mm in m.moe_layers())
    routed = c["routed_experts"]
    bf16 = c["total"] - routed - (f32 - sum(mm.gate.e_score_correction_bias.numel() for mm in m.moe_layers()))
    exp_bytes = routed // 2 + routed // 32 if cfg.mxfp4_experts else routed * 2
    c["bytes"] = bf16 * 2 + f32 * 4 + exp_bytes
    c["bytes_bf16_experts"] = bf16 * 2 + f32 * 4 + routed * 2
    return c


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _build_meta(cfg):
    from k3tiny.model_train import K3Tiny
    K3Tiny.reset_parameters_orig = K3Tiny.reset_parameters
    try:
        K3Tiny.reset_parameters = lambda self, seed=None: None
        return K3Tiny(cfg)
    finally:
        K3Tiny.reset_parameters = K3Tiny.reset_parameters_orig


if __name__ == "__main__":
    out = os.path.join(HERE, "k3tiny_config.json")
    kw = {}
    cfgd = make_config(**kw)
    with open(out, "w") as f:
        json.dump(cfgd, f, indent=2)
        f.write("\n")
    c = predicted_size(cfgd)
    print(json.dumps({k: v for k, v in c.items()}, indent=1))
    print(f"predicted checkpoint: {c['bytes'] / 1e6:.2f} MB (MXFP4 experts), {c['bytes_bf16_experts'] / 1e6:.2f} MB (BF16 experts)")
