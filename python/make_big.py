"""A K3-architecture checkpoint bigger than RAM, written as a stream (docs/bigger-than-ram.md).

Mostly MXFP4 routed experts (hidden 2048, latent 1024, 1024 experts of intermediate 1024 per layer); the
dense part (KDA / MLA / shared experts / embeddings, BF16) comes from k3ref's tiny-checkpoint builder
at this size. Random but well scaled: expert nibbles uniform over E2M1 with E8M0 scales 2^-7 / 2^-6 (element
RMS ~ 1/sqrt(1024), as a trained layer's), so activations stay finite over every layer.

Routing is skewed on purpose (real MoE routers are: a few experts take most tokens): the correction bias of
expert e is `skew * (1 - rank_e / E) ** 4` over a random ranking, which makes a hot set a cache can keep.

The generator holds one shard's dense tensors and a 64 MiB random pool at a time (peak RSS ~2 GB), and
writes each shard's header first, then the tensors in header order.

    python3 python/make_big.py --out /work/big/k3-big --layers 23 --experts 1024   # ~39 GB
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
from k3ref import checkpoint as ck  # noqa: E402
from k3ref import mxfp4  # noqa: E402
from k3ref.safetensors_io import BF16Array, _dtype_of, _raw  # noqa: E402


def big_config(layers: int, experts: int, inter: int, latent: int) -> dict:
    cfg = ck.tiny_k3_config()
    t = cfg["text_config"]
    V = 32768
    t.update(vocab_size=V, hidden_size=2048, num_hidden_layers=layers, num_attention_heads=16,
             intermediate_size=5632, q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=128,
             qk_rope_head_dim=64, v_head_dim=128, num_experts=experts, num_experts_per_token=8,
             num_shared_experts=1, moe_intermediate_size=inter, routed_expert_hidden_size=latent,
             attn_res_block_size=4, bos_token_id=V - 256, eos_token_id=V - 254, pad_token_id=V - 1)
    full = [i for i in range(1, layers + 1) if i % 4 == 0]
    t["linear_attn_config"] = OrderedDict(kda_layers=[i for i in range(1, layers + 1) if i not in full],
                                          full_attn_layers=full, head_dim=128, num_heads=16,
                                          short_conv_kernel_size=4, gate_lower_bound=-5.0,
                                          use_full_rank_gate=False)
    cfg.update(bos_token_id=V - 256, eos_token_id=V - 254, pad_token_id=V - 1)
    return cfg


def dense_tensors(cfg: dict, seed: int) -> "OrderedDict[str, object]":
    """Every tensor but the routed experts (k3ref's builder with 8 experts, whose expert tensors are dropped)."""
    small = json.loads(json.dumps(cfg), object_pairs_hook=OrderedDict)
    small["text_config"]["num_experts"] = 8
    real_quantize = mxfp4.quantize
    mxfp4.quantize = lambda w: (np.zeros((w.shape[0], w.shape[1] // 2), np.uint8),
                                np.full((w.shape[0], w.shape[1] // 32), 127, np.uint8))
    try:
        t = ck.build_tensors(small, seed)
    finally:
        mxfp4.quantize = real_quantize
    return OrderedDict((k, v) for k, v in t.items() if ".experts." not in k)


class ExpertSource:
    """Bytes of the routed-expert tensors, made on demand (nothing is held)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed + 1)
        self.pool = self.rng.integers(0, 256, size=64 << 20, dtype=np.uint8).tobytes()

    def packed(self, n: int) -> memoryview:
        off = int(self.rng.integers(0, len(self.pool) - n))
        return memoryview(self.pool)[off:off + n]

    def scales(self, n: int) -> bytes:
        return self.rng.integers(120, 122, size=n, dtype=np.uint8).tobytes()


def layer_of(name: str) -> int:
    parts = name.split(".layers.")
    return int(parts[1].split(".")[0]) if len(parts) > 1 else -1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=23)
    ap.add_argument("--experts", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=1024)
    ap.add_argument("--latent", type=int, default=1024)
    ap.add_argument("--skew", type=float, default=0.5)
    ap.add_argument("--layers-per-shard", type=int, default=2)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    cfg = big_config(a.layers, a.experts, a.inter, a.latent)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    t0 = time.time()
    dense = dense_tensors(cfg, a.seed)
    print(f"dense tensors built in {time.time() - t0:.0f} s", flush=True)
    rng = np.random.default_rng(a.seed + 2)
    E, I, X = a.experts, a.inter, a.latent
    # The router and bias at full E (replacing the 8-expert ones).
    for name in list(dense):
        if name.endswith("block_sparse_moe.gate.weight"):
            dense[name] = BF16Array.from_f32(rng.standard_normal((E, 2048)) * (1.5 / math.sqrt(2048)))
        elif name.endswith("gate.e_score_correction_bias"):
            rank = rng.permutation(E)
            dense[name] = (a.skew * (1.0 - rank / E) ** 4).astype(np.float32)
    # Expert tensors: name -> (dtype, shape, kind)
    shapes = {"w1": (I, X), "w3": (I, X), "w2": (X, I)}
    entries = OrderedDict()  # name -> (dtype, shape, nbytes, payload or kind)
    for name, v in dense.items():
        entries[name] = (_dtype_of(v), list(v.shape), len(_raw(v)), v)
    for layer in range(a.layers):
        pre = f"language_model.model.layers.{layer}.block_sparse_moe."
        if not any(k.startswith(pre) for k in dense):
            continue
        for e in range(E):
            for wn, (o, ii) in shapes.items():
                b = pre + f"experts.{e}.{wn}."
                entries[b + "weight_packed"] = ("U8", [o, ii // 2], o * ii // 2, "packed")
                entries[b + "weight_scale"] = ("U8", [o, ii // 32], o * ii // 32, "scale")
    prefix = next(iter(dense)).split("embed_tokens")[0] if "embed_tokens" in next(iter(dense)) else ""
    _ = prefix
    # Shards: layers grouped `layers-per-shard` at a time; non-layer tensors with the first / last shard.
    n_shards = (a.layers + a.layers_per_shard - 1) // a.layers_per_shard
    groups = [[] for _ in range(n_shards)]
    for name in entries:
        li = layer_of(name)
        groups[0 if li < 0 and "embed" in name else (n_shards - 1 if li < 0 else li // a.layers_per_shard)].append(name)
    src = ExpertSource(a.seed)
    weight_map, total = {}, 0
    for si, names in enumerate(groups):
        fn = f"model-{si + 1:05d}-of-{n_shards:05d}.safetensors"
        names = sorted(names)
        header, off = {}, 0
        for n in names:
            dt, shape, nb, _ = entries[n]
            header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
            off += nb
            weight_map[n] = fn
        header["__metadata__"] = {"format": "pt"}
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(os.path.join(a.out, fn), "wb", buffering=16 << 20) as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for n in names:
                dt, shape, nb, p = entries[n]
                if isinstance(p, str):
                    f.write(src.packed(nb) if p == "packed" else src.scales(nb))
                else:
                    f.write(_raw(p))
        total += off
        print(f"{fn}: {off / 1e9:.2f} GB, {total / 1e9:.1f} GB so far, {time.time() - t0:.0f} s", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    print(f"done: {total / 1e9:.1f} GB in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
