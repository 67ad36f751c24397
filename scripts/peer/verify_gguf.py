#!/usr/bin/env python3
"""Bit-level check that a GGUF made by convert_gguf.py holds the checkpoint's own weights:
 - every routed-expert tensor blk.L.ffn_{gate,up,down}_exps (ggml MXFP4, 17-byte blocks: E8M0 byte + 16 bytes,
   byte j = element j low nibble | element j+16 high nibble) against the checkpoint's compressed-tensors
   weight_packed (byte i = element 2i low | 2i+1 high) + weight_scale, expert by expert: codes and scales equal;
 - every GGUF BF16 tensor whose checkpoint tensor maps 1:1 (same element count, BF16) is byte-identical.
Independent of the converter's repack code (decodes both layouts to per-element codes here).
usage: verify_gguf.py LLAMA_SRC CKPT_DIR M.gguf"""
import json, os, re, sys
import numpy as np
llama, ckpt, path = sys.argv[1:4]
sys.path.insert(0, os.path.join(llama, "gguf-py"))
from gguf import GGUFReader, GGMLQuantizationType as Q  # noqa: E402
from safetensors import safe_open  # noqa: E402

idx = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))["weight_map"]
handles = {}
def st(name):
    f = idx[name]
    if f not in handles:
        handles[f] = safe_open(os.path.join(ckpt, f), "np")
    return handles[f].get_tensor(name)
def st_bf16_bytes(name):  # safetensors numpy cannot hold bf16: read raw bytes via the header
    f = os.path.join(ckpt, idx[name])
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little"); hdr = json.loads(fh.read(n)); a, b = hdr[name]["data_offsets"]
        fh.seek(8 + n + a); return np.frombuffer(fh.read(b - a), dtype=np.uint8), hdr[name]["dtype"]

pre = next(k for k in idx if k.endswith("embed_tokens.weight")).split("embed_tokens")[0]
r = GGUFReader(path)
n_exp_ok = n_bf16_ok = 0
bad = []
for t in r.tensors:
    m = re.match(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight", t.name)
    if m:
        assert t.tensor_type == Q.MXFP4, (t.name, t.tensor_type)
        L, w = int(m.group(1)), {"gate": "w1", "down": "w2", "up": "w3"}[m.group(2)]
        data = np.asarray(t.data, dtype=np.uint8)
        E = data.shape[0]
        for e in range(E):
            base = f"{pre}layers.{L}.block_sparse_moe.experts.{e}.{w}."
            pk, sc = st(base + "weight_packed"), st(base + "weight_scale")
            rows, half = pk.shape
            blk = data[e].reshape(rows, half * 2 // 32, 17)
            g_scale = blk[:, :, 0]
            q = blk[:, :, 1:]
            g_codes = np.concatenate([q & 15, q >> 4], axis=-1).reshape(rows, half * 2)
            s_codes = np.stack([pk & 15, pk >> 4], axis=-1).reshape(rows, half * 2)
            if not (np.array_equal(g_scale, sc) and np.array_equal(g_codes, s_codes)):
                bad.append(f"{t.name} expert {e}")
        n_exp_ok += E
    elif t.tensor_type == Q.BF16:
        # 1:1 names the converter keeps as plain copies
        simple = {"token_embd.weight": pre + "embed_tokens.weight", "output.weight": "lm_head.weight",
                  "output_norm.weight": pre + "norm.weight"}
        src = simple.get(t.name)
        if src is None:
            mm = re.match(r"blk\.(\d+)\.(attn_q_a|attn_q_b|attn_kv_a_mqa|attn_output|ffn_gate_shexp|ffn_up_shexp|ffn_down_shexp|ssm_g|attn_gate)\.weight", t.name)
            if mm:
                L, k = mm.groups()
                a = {"attn_q_a": "self_attn.q_a_proj", "attn_q_b": "self_attn.q_b_proj",
                     "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_output": "self_attn.o_proj",
                     "ffn_gate_shexp": "block_sparse_moe.shared_experts.gate_proj",
                     "ffn_up_shexp": "block_sparse_moe.shared_experts.up_proj",
                     "ffn_down_shexp": "block_sparse_moe.shared_experts.down_proj",
                     "ssm_g": "self_attn.g_proj", "attn_gate": "self_attn.g_proj"}[k]
                src = f"{pre}layers.{L}.{a}.weight"
        if src is not None and src in idx:
            raw, dt = st_bf16_bytes(src)
            if dt != "BF16" or not np.array_equal(raw, np.asarray(t.data).view(np.uint8).reshape(-1)):
                bad.append(t.name)
            n_bf16_ok += 1
types = {}
for t in r.tensors:
    types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
print(f"{path}: tensor types {types}")
print(f"MXFP4 experts compared: {n_exp_ok} (codes + E8M0 scales); BF16 tensors compared byte-for-byte: {n_bf16_ok}")
print("MISMATCH: " + ", ".join(bad[:10]) if bad else "all identical")
sys.exit(1 if bad else 0)
