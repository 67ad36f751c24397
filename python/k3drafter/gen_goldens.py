#!/usr/bin/env python3
"""Writes tests/data/drafter-golden/ (the C++ side's goldens for the block drafter, docs/block-drafter.md):

  drafter/               a RANDOM-weight K3BlockDrafter dir for a k3-tiny-shaped target (hidden 256, vocab
                         8192, 12 layers): 2 layers, 4 heads x 32 (so nh*hd != H), intermediate 128, block 8,
                         taps [2, 6, 10, 12]
  taps.bin / taps.json   k3ref float64 taps of models/k3-tiny for a fixed 20-token sequence, every position
  cases.bin / cases.json (ctx, token) inputs and the float64 logits of every block position, computed by the
                         independent numpy implementation (reference.py) with k3-tiny's real embedding and
                         lm_head; ctx = the taps golden's rows (rounded to float32), token = the next token

  python3 python/k3drafter/gen_goldens.py [--out tests/data/drafter-golden] [--target models/k3-tiny]

Needs torch, numpy and tiktoken (the sequence is tokenised with k3-tiny's tokenizer). It also measures what a
float32 implementation reaches (torch float32 vs the float64 values) and writes it into the JSON files.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # python/

from k3drafter.model import DrafterConfig, K3BlockDrafter, load_target_tables  # noqa: E402
from k3drafter.reference import forward_f64, load_weights_f64  # noqa: E402
from k3drafter.taps import load_fast, load_reference, taps_reference, taps_fast  # noqa: E402

TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
N_TOKENS = 20          # BOS + 19: its min MoE routing margin in k3-tiny is 2.7e-4 (a float32 forward keeps the experts)
TAP_IDS = [2, 6, 10, 12]
CASE_POSITIONS = [0, 9, 18]   # ctx = taps at p, token = tokens[p + 1]


def tokens(target):
    from k3tiny.common import make_encoding
    enc = make_encoding(target)
    with open(os.path.join(target, "config.json")) as f:
        bos = json.load(f)["bos_token_id"]
    return ([bos] + enc.encode_ordinary(TEXT))[:N_TOKENS]


def random_drafter(tcfg, embed, head, seed=17):
    cfg = DrafterConfig(hidden_size=tcfg.hidden_size, num_hidden_layers=2, num_attention_heads=4, head_dim=32,
                        intermediate_size=128, block_size=8, target_layer_ids=TAP_IDS,
                        rms_norm_eps=tcfg.rms_norm_eps, target_hidden_size=tcfg.hidden_size,
                        target_vocab_size=tcfg.vocab_size, target_num_layers=tcfg.num_hidden_layers)
    m = K3BlockDrafter(cfg, embed, head)
    m.reset_parameters(seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):      # 1 +- 0.1: a reader that drops a norm weight fails
                p.copy_(1.0 + (torch.rand(p.shape, generator=g) * 0.2 - 0.1))
            elif name == "position_embedding":    # std 0.5: positions clearly distinct
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):   # plain N(0, 1/fan_in): layers matter
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return m


def write_bin(path, arr):
    np.ascontiguousarray(arr, dtype="<f4").tofile(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/drafter-golden")
    ap.add_argument("--target", default="models/k3-tiny")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)

    # -- taps golden (k3ref float64) + how far float32 forwards land
    ids = tokens(a.target)
    ref64 = load_reference(a.target, torch.float64)
    taps64 = taps_reference(ref64, ids, TAP_IDS)                         # [n, T, H]
    margin = ref64.stats["min_route_margin"]
    ref32 = load_reference(a.target, torch.float32)
    d_ref32 = float((taps_reference(ref32, ids, TAP_IDS).double() - taps64).abs().max())
    fast = load_fast(a.target, ref=ref32)
    d_fast = float((taps_fast(fast, torch.tensor([ids]), TAP_IDS)[0].double() - taps64).abs().max())
    write_bin(os.path.join(a.out, "taps.bin"), taps64.numpy())
    taps_meta = {
        "target": a.target, "text": TEXT, "tokens": ids, "tap_ids": TAP_IDS,
        "file": "taps.bin", "dtype": "float32 little-endian", "shape": list(taps64.shape),
        "order": "[token position][tap, in tap_ids order][H]: the row of position p = the taps the target "
                 "computes for token p in one prefill of `tokens` from a fresh state",
        "computed_with": "python/k3ref/model.py float64, kda_mode chunk (values rounded to float32 when stored)",
        "max_abs_tap": float(taps64.abs().max()),
        "min_moe_route_margin": margin,
        "measured_max_abs_err": {"k3ref_float32": d_ref32, "model_train_float32": d_fast},
        "suggested_tolerance_abs": 1e-3,
    }
    with open(os.path.join(a.out, "taps.json"), "w") as f:
        json.dump(taps_meta, f, indent=1)
        f.write("\n")

    # -- random drafter + cases (logits from the numpy float64 implementation of the stored weights)
    tcfg, embed, head = load_target_tables(a.target)
    ddir = os.path.join(a.out, "drafter")
    random_drafter(tcfg, embed, head).save_dir(ddir)
    cfgd, W = load_weights_f64(ddir)
    ctx = taps64.numpy().astype(np.float32)[CASE_POSITIONS].reshape(len(CASE_POSITIONS), -1)   # [n, T*H]
    toks = [ids[p + 1] for p in CASE_POSITIONS]
    emb64, head64 = embed.numpy().astype(np.float64), head.numpy().astype(np.float64)
    logits = np.stack([forward_f64(cfgd, W, emb64, head64, ctx[i], toks[i]) for i in range(len(toks))])
    # float32 torch module from the same files: what a float32 implementation reaches
    m32 = K3BlockDrafter.from_dir(ddir, target=(embed, head), dtype=torch.float32)
    with torch.no_grad():
        l32 = m32(torch.from_numpy(ctx), torch.tensor(toks)).double().numpy()
    err32 = float(np.abs(l32 - logits).max())
    srt = np.sort(logits, -1)
    write_bin(os.path.join(a.out, "ctx.bin"), ctx)
    write_bin(os.path.join(a.out, "logits.bin"), logits)
    cases_meta = {
        "drafter": "drafter", "target": a.target, "n_cases": len(toks), "tokens": toks,
        "ctx": {"file": "ctx.bin", "dtype": "float32 little-endian", "shape": list(ctx.shape),
                "source": f"taps.bin rows at positions {CASE_POSITIONS} (token = the next token of taps.json)"},
        "logits": {"file": "logits.bin", "dtype": "float32 little-endian", "shape": list(logits.shape),
                   "order": "[case][block position j][vocab id]",
                   "computed_with": "python/k3drafter/reference.py, float64, weights as stored (BF16 matrices)"},
        "argmax": logits.argmax(-1).tolist(),
        "min_top1_top2_gap": float((srt[..., -1] - srt[..., -2]).min()),
        "max_abs_logit": float(np.abs(logits).max()),
        "measured_max_abs_err": {"torch_float32": err32},
        "suggested_tolerance_abs": 1e-3,
    }
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump(cases_meta, f, indent=1)
        f.write("\n")
    print(json.dumps({"taps_err_ref32": d_ref32, "taps_err_fast32": d_fast, "route_margin": margin,
                      "logits_err_f32": err32, "max_abs_logit": cases_meta["max_abs_logit"],
                      "min_gap": cases_meta["min_top1_top2_gap"]}))


if __name__ == "__main__":
    main()
