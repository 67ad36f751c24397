#!/usr/bin/env python3
"""A random Kimi K3 checkpoint at the TRUE K3 dimensions (hidden 7168, KDA 96 x 128, MLA 96 heads with q_lora 1536,
896 MXFP4 routed experts top-16 in a 3584 latent, 2 shared experts, vocab 163840), cut to its first N layers (issue
18's "K3-dimension slice"): layer 1 KDA + dense MLP (first_k_dense_replace = 1), then KDA + MoE layers, the last one
MLA + MoE so that every kind of layer is in the slice (K3 puts MLA at every 4th layer: a 4-layer slice is the real
layout, a 2-layer one moves MLA to layer 2). One MoE layer is ~15.8 GB of MXFP4 experts, so a 2-layer slice is
~22 GB, 4 layers ~53 GB. Written fast enough to make on the GPU machine inside a device call, as
make_kl_slice.py (whose writer this reuses): big BF16 matrices are windows of a pre-rounded normal pool at the
matrix's std; MXFP4 experts are windows of a pool of random E2M1 bytes with E8M0 scales near what a N(0, 1/fan_in)
matrix quantises to. Routing is near-uniform, text is gibberish, speeds are real. The same directory feeds k3 (HF
dir) and `k3 convert` (the kimi-k3 GGUF llama.cpp reads).
  usage: make_k3_slice.py OUT_DIR [--layers N=2] [--tiny]     (--tiny: hidden 256, 8 heads, 32 experts: a rehearsal)
"""
import json, math, os, sys
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_kl_slice import POOL, Writer, kda_core, layers_arg, mla_kv, moe_core, write_slice  # noqa: E402

PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "resources", "presets", "kimi-k3.json")


def slice_config(layers, tiny):
    cfg = json.load(open(PRESET), object_pairs_hook=OrderedDict)
    cfg.pop("vision_config", None)
    t = cfg["text_config"]
    la = t["linear_attn_config"]
    full = [i for i in la["full_attn_layers"] if i <= layers]
    if not full:
        full = [layers]   # a slice shorter than K3's first MLA layer (4): the last layer is MLA
    la["full_attn_layers"] = full
    la["kda_layers"] = [i for i in range(1, layers + 1) if i not in full]
    t["num_hidden_layers"] = layers
    t["attn_res_block_size"] = min(t["attn_res_block_size"], layers)   # a block may not exceed the model
    t["max_position_embeddings"] = 1 << 20
    if tiny:
        t.update(hidden_size=256, intermediate_size=512, num_attention_heads=8, q_lora_rank=128, num_experts=32,
                 num_experts_per_token=4, moe_intermediate_size=128, routed_expert_hidden_size=128)
        la["num_heads"] = 8
    return cfg


class K3Writer(Writer):
    """make_kl_slice's writer plus MXFP4 experts: packed E2M1 bytes and E8M0 scales as windows of byte pools."""

    def __init__(self, seed=11):
        super().__init__(seed)
        self.packed = self.rng.integers(0, 256, 2 * POOL, dtype=np.uint8)
        # E8M0 near 2^(floor(log2(2.5 / sqrt(fan_in))) - 2), the scale a group of N(0, 1/fan_in) values gets
        # (amax of 32 normals ~2.5 sigma, E2M1's largest magnitude 6 = 1.5 x 2^2); set per fan-in below.
        self.scales = {}

    def u8(self, name, shape, pool):
        n = int(np.prod(shape))

        def chunks(pool=pool, n=n):
            while n > 0:
                m = min(n, POOL)
                off = int(self.rng.integers(0, POOL))
                yield memoryview(pool[off:off + m])
                n -= m
        self.specs[name] = ("U8", list(shape), chunks)

    def mxfp4(self, base, out, inn):
        if inn not in self.scales:
            e = 127 + math.floor(math.log2(2.5 / math.sqrt(inn))) - 2
            self.scales[inn] = self.rng.integers(e - 1, e + 2, 2 * POOL, dtype=np.uint8)
        self.u8(base + ".weight_packed", (out, inn // 2), self.packed)
        self.u8(base + ".weight_scale", (out, inn // 32), self.scales[inn])


def kda(w, a, H, Hk, D, Kc):
    rng = w.rng
    kda_core(w, a, H, Hk, D, Kc)
    w.small(a + "dt_bias", rng.uniform(-5.0, -2.5, Hk * D), "F32")   # bounded gate (gate_lower_bound -5)
    A = np.zeros(max(128, Hk), dtype=np.float32)                    # K3's layout: [128], zero-padded past Hk
    A[:Hk] = np.log(rng.uniform(0.6, 1.4, Hk))
    w.small(a + "A_log", A, "F32")
    w.lin(a + "b_proj.weight", Hk, H)
    w.lin(a + "g_proj.weight", Hk * D, H)                            # use_full_rank_gate
    w.norm(a + "o_norm.weight", D)
    w.lin(a + "o_proj.weight", H, Hk * D)


def mla(w, a, t, H):
    nh, nope, rope, vd, r, ql = (t["num_attention_heads"], t["qk_nope_head_dim"], t["qk_rope_head_dim"],
                                 t["v_head_dim"], t["kv_lora_rank"], t["q_lora_rank"])
    w.lin(a + "q_a_proj.weight", ql, H)
    w.norm(a + "q_a_layernorm.weight", ql)
    w.lin(a + "q_b_proj.weight", nh * (nope + rope), ql)
    mla_kv(w, a, H, nh, nope, rope, vd, r)
    w.lin(a + "g_proj.weight", nh * vd, H)                           # mla_use_output_gate


def moe(w, m, t, H):
    E, I, X = t["num_experts"], t["moe_intermediate_size"], t["routed_expert_hidden_size"]
    moe_core(w, m, H, E, I, X, t["num_shared_experts"], w.mxfp4)
    w.lin(m + "routed_expert_down_proj.weight", X, H)
    w.norm(m + "routed_expert_norm.weight", X)
    w.lin(m + "routed_expert_up_proj.weight", H, X)


def build(cfg, w):
    t = cfg["text_config"]
    H, V, L = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]
    la = t["linear_attn_config"]
    pre = "language_model.model."
    w.lin(pre + "embed_tokens.weight", V, H, math.sqrt(H))
    for i in range(L):
        p = f"{pre}layers.{i}."
        w.norm(p + "input_layernorm.weight", H)
        w.norm(p + "post_attention_layernorm.weight", H)
        for nm in ("self_attention_res", "mlp_res"):                 # Attention Residuals
            w.norm(p + nm + "_norm.weight", H)
            w.lin(p + nm + "_proj.weight", 1, H, 2.0)
        if (i + 1) in la["kda_layers"]:
            kda(w, p + "self_attn.", H, la["num_heads"], la["head_dim"], la["short_conv_kernel_size"])
        else:
            mla(w, p + "self_attn.", t, H)
        if i < t["first_k_dense_replace"]:
            m = p + "mlp."
            w.lin(m + "gate_proj.weight", t["intermediate_size"], H)
            w.lin(m + "up_proj.weight", t["intermediate_size"], H)
            w.lin(m + "down_proj.weight", H, t["intermediate_size"])
        else:
            moe(w, p + "block_sparse_moe.", t, H)
    w.norm(pre + "output_attn_res_norm.weight", H)
    w.lin(pre + "output_attn_res_proj.weight", 1, H, 2.0)
    w.norm(pre + "norm.weight", H)
    w.lin("language_model.lm_head.weight", V, H, 2.0)


def main():
    out = sys.argv[1]
    cfg = slice_config(layers_arg(2), "--tiny" in sys.argv)
    w = K3Writer()
    n = write_slice(out, cfg, cfg["text_config"]["vocab_size"], w, build)
    print(f"{out}: {n / 1e9:.2f} B stored elements (MXFP4 experts: 2 weights a byte), {len(w.specs)} tensors")


if __name__ == "__main__":
    main()
