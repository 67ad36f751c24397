#!/usr/bin/env python3
"""A random Kimi-Linear checkpoint at the TRUE Kimi-Linear-48B-A3B dimensions, cut to its first N layers (the
issue-18 slice: layer 1 dense, 2-3 KDA + MoE, 4 MLA + MoE; 256 BF16 experts top-8, vocab 163840; 6.3B params,
12.6 GB), written fast enough to make on the GPU machine inside a device call (the 64 MiB tree cannot carry it):
every big BF16 matrix is a window, at a random offset, of one 16 M-value pool of N(0, 1) samples pre-rounded to
bf16 at that matrix's std (gain / sqrt(fan_in), the scales of python/k3ref/checkpoint.py), so the writer only
slices and writes bytes. Small tensors (norms, convs, dt_bias, A_log, router bias) are drawn per tensor with
the distributions of checkpoint.py. Values are random but well scaled: routing is near-uniform, text is
gibberish, speeds are real. The same directory feeds k3 (HF dir) and llama.cpp (scripts/peer/convert_gguf.py),
so both engines see the same numbers and the same routing.
  usage: make_kl_slice.py OUT_DIR [--layers N=4] [--tiny]     (--tiny: hidden 256, 16 experts: a rehearsal)
The tokenizer: the real Kimi tiktoken.model ($K3_SHARED_DIR/data/tokenizers/kimi) + a tokenizer_config.json
naming the first specials, as scripts/peer/make_tok32k.py does for its 32k cut."""
import json, math, os, shutil, struct, sys
from collections import OrderedDict
import numpy as np

PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "resources", "presets",
                      "kimi-linear-48b-a3b.json")
POOL = 1 << 24


def slice_config(layers, tiny):
    cfg = json.load(open(PRESET), object_pairs_hook=OrderedDict)
    la = cfg["linear_attn_config"]
    la["kda_layers"] = [i for i in la["kda_layers"] if i <= layers]
    la["full_attn_layers"] = [i for i in la["full_attn_layers"] if i <= layers]
    cfg["num_hidden_layers"] = layers
    cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    cfg["max_position_embeddings"] = 1 << 20
    cfg["torch_dtype"] = "bfloat16"
    if tiny:
        cfg.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=4,
                   num_experts=16, moe_intermediate_size=128)
        la["num_heads"] = 4   # llama.cpp sizes the KDA convs by the attention heads: keep them equal
    return cfg


class Writer:
    def __init__(self, seed=7):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.standard_normal(POOL, dtype=np.float32)
        self.by_std = {}
        self.specs = OrderedDict()   # name -> (dtype, shape, bytes-producer)

    def bf16(self, x):
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def lin(self, name, out, inn, gain=1.0):
        std = gain / math.sqrt(inn)
        if std not in self.by_std:   # doubled so that any window of <= POOL values is one slice
            b = self.bf16(self.pool * np.float32(std))
            self.by_std[std] = np.concatenate([b, b])
        src, n = self.by_std[std], out * inn

        def chunks(src=src, n=n):
            while n > 0:
                m = min(n, POOL)
                off = int(self.rng.integers(0, POOL))
                yield memoryview(src[off:off + m]).cast("B")
                n -= m
        self.specs[name] = ("BF16", [out, inn], chunks)

    def small(self, name, arr, dtype):
        a = self.bf16(arr) if dtype == "BF16" else np.ascontiguousarray(arr, dtype=np.float32)
        self.specs[name] = (dtype, list(np.shape(arr)), lambda a=a: iter([a.tobytes()]))

    def norm(self, name, n):
        self.small(name, 1.0 + 0.1 * self.rng.standard_normal(n), "BF16")


def kda_core(w, a, H, Hk, D, Kc):
    """The KDA projections both architectures share: q/k/v with their short convs, the decay's f_a / f_b."""
    for c in "qkv":
        w.lin(a + f"{c}_proj.weight", Hk * D, H)
    for c in "qkv":
        cw = 0.4 * w.rng.standard_normal((Hk * D, 1, Kc))
        cw[..., -1] += 0.8
        w.small(a + f"{c}_conv1d.weight", cw, "F32")
    w.lin(a + "f_a_proj.weight", D, H)
    w.lin(a + "f_b_proj.weight", Hk * D, D, 0.5)


def mla_kv(w, a, H, nh, nope, rope, vd, r):
    """MLA's latent KV path and output projection (both architectures)."""
    w.lin(a + "kv_a_proj_with_mqa.weight", r + rope, H)
    w.norm(a + "kv_a_layernorm.weight", r)
    w.lin(a + "kv_b_proj.weight", nh * (nope + vd), r)
    w.lin(a + "o_proj.weight", H, nh * vd)


def moe_core(w, m, H, E, I, X, n_shared, expert):
    """Router, routed experts (expert(name, out, in) writes one matrix; X their width) and shared experts."""
    w.lin(m + "gate.weight", E, H, 1.5)
    w.small(m + "gate.e_score_correction_bias", w.rng.uniform(-0.15, 0.15, E), "F32")
    for e in range(E):
        for wn, (o, ii) in (("w1", (I, X)), ("w3", (I, X)), ("w2", (X, I))):
            expert(m + f"experts.{e}.{wn}", o, ii)
    Is = I * n_shared
    w.lin(m + "shared_experts.gate_proj.weight", Is, H)
    w.lin(m + "shared_experts.up_proj.weight", Is, H)
    w.lin(m + "shared_experts.down_proj.weight", H, Is)


def build(cfg, w):
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    la = cfg["linear_attn_config"]
    Hk, D, Kc = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    nh, nope, rope, vd, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                             cfg["v_head_dim"], cfg["kv_lora_rank"])
    E, I, rng = cfg["num_experts"], cfg["moe_intermediate_size"], w.rng
    w.lin("model.embed_tokens.weight", V, H, math.sqrt(H))   # std 1, as checkpoint.py
    for i in range(L):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        w.norm(p + "input_layernorm.weight", H)
        w.norm(p + "post_attention_layernorm.weight", H)
        if (i + 1) in la["kda_layers"]:
            kda_core(w, a, H, Hk, D, Kc)
            w.small(a + "dt_bias", rng.uniform(-3.0, -0.3, Hk * D), "F32")
            w.small(a + "A_log", np.log(rng.uniform(0.3, 1.0, (1, 1, Hk, 1))), "F32")
            w.lin(a + "b_proj.weight", Hk, H)
            w.lin(a + "g_a_proj.weight", D, H)
            w.lin(a + "g_b_proj.weight", Hk * D, D)
            w.norm(a + "o_norm.weight", D)
            w.lin(a + "o_proj.weight", H, Hk * D)
        else:
            w.lin(a + "q_proj.weight", nh * (nope + rope), H)
            mla_kv(w, a, H, nh, nope, rope, vd, r)
        if i < cfg["first_k_dense_replace"]:
            m = p + "mlp."
            w.lin(m + "gate_proj.weight", cfg["intermediate_size"], H)
            w.lin(m + "up_proj.weight", cfg["intermediate_size"], H)
            w.lin(m + "down_proj.weight", H, cfg["intermediate_size"])
            continue
        moe_core(w, p + "block_sparse_moe.", H, E, I, H, cfg["num_shared_experts"],
                 lambda name, o, ii: w.lin(name + ".weight", o, ii))
    w.norm("model.norm.weight", H)
    w.lin("lm_head.weight", V, H, 2.0)


def write_shards(w, out, shard_bytes=4 << 30):
    size = {"BF16": 2, "F32": 4, "U8": 1}
    shards, cur, cur_b = [], [], 0
    for name, (dt, shape, _) in w.specs.items():
        nb = int(np.prod(shape)) * size[dt]
        if cur and cur_b + nb > shard_bytes:
            shards.append(cur); cur, cur_b = [], 0
        cur.append(name); cur_b += nb
    shards.append(cur)
    index = {"metadata": {}, "weight_map": {}}
    for k, names in enumerate(shards):
        fn = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        hdr, off = {}, 0
        for name in names:
            dt, shape, _ = w.specs[name]
            nb = int(np.prod(shape)) * size[dt]
            hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}; off += nb
            index["weight_map"][name] = fn
        hb = json.dumps(hdr).encode(); hb += b" " * (-len(hb) % 8)
        with open(os.path.join(out, fn), "wb") as f:
            f.write(struct.pack("<Q", len(hb))); f.write(hb)
            for name in names:
                for c in w.specs[name][2]():
                    f.write(c)
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    return sum(int(np.prod(s[1])) for s in w.specs.values())


def write_tokenizer(out, V):
    src = os.path.join(os.environ.get("K3_SHARED_DIR", "/work/shared"), "data", "tokenizers", "kimi",
                       "tiktoken.model")
    if not os.path.exists(src):   # on the GPU machine: carried beside this script's tree
        src = os.environ["KIMI_TIKTOKEN"]
    shutil.copy(src, os.path.join(out, "tiktoken.model"))
    n_ranks = sum(1 for _ in open(src))
    names = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 9: "[EOT]", 254: "[UNK]", 255: "[PAD]"}
    added = {str(n_ranks + k): {"content": v, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": True} for k, v in names.items()}
    assert n_ranks + 256 == V, (n_ranks, V)
    cfg = {"added_tokens_decoder": added, "bos_token": "[BOS]",
           "eos_token": {"content": "[EOS]", "special": True},
           "model_max_length": 1 << 20, "tokenizer_class": "TikTokenTokenizer"}
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)


def write_slice(out, cfg, vocab, w, build_fn):
    """config.json, the tokenizer and the shards of build_fn(cfg, w) into out; returns the stored elements."""
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    write_tokenizer(out, vocab)
    build_fn(cfg, w)
    return write_shards(w, out)


def layers_arg(default):
    return int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else default


def main():
    out = sys.argv[1]
    cfg = slice_config(layers_arg(4), "--tiny" in sys.argv)
    w = Writer()
    n = write_slice(out, cfg, cfg["vocab_size"], w, build)
    print(f"{out}: {n / 1e9:.2f} B params, {len(w.specs)} tensors")


if __name__ == "__main__":
    main()
