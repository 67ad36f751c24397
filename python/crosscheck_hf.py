#!/usr/bin/env python3
"""Cross-check k3ref against HF transformers' native `kimi_linear` on the tiny Kimi-Linear checkpoint.

Needs torch >= 2.6 and transformers >= 5.x with models/kimi_linear (no flash-linear-attention needed:
transformers falls back to its own torch KDA code). Runs on CPU or GPU:
  python3 python/crosscheck_hf.py [--device cuda] [--ckpt tests/data/tiny-kimi-linear]
Prints max |HF - k3ref| for prefill and for cached token-by-token decode, with k3ref's MLA-internal norm eps
set to the spec value (rms_norm_eps) and to HF's 1e-6, and writes a JSON summary to --out if given.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from k3ref.model import load_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=os.path.join(HERE, "..", "tests", "data", "tiny-kimi-linear"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ckpt = os.path.normpath(a.ckpt)
    name = os.path.basename(ckpt)
    with open(os.path.join(HERE, "..", "tests", "data", "goldens", name, "tokens.json")) as f:
        toks = json.load(f)

    import transformers
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").to(a.device).eval()
    ids = torch.tensor([toks], device=a.device)
    with torch.no_grad():
        lp = hf(input_ids=ids, use_cache=False).logits[0].double().cpu()
        out = hf(input_ids=ids[:, :1], use_cache=True)
        steps = [out.logits[0]]
        pkv = out.past_key_values
        for t in range(1, len(toks)):
            out = hf(input_ids=ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            steps.append(out.logits[0])
        ld = torch.cat(steps).double().cpu()

    res = {"transformers": transformers.__version__, "torch": torch.__version__, "device": a.device,
           "checkpoint": ckpt, "n_tokens": len(toks)}
    for label, eps in (("spec_eps", None), ("hf_mla_eps_1e-6", 1e-6)):
        m = load_model(ckpt, torch.float64)
        if eps is not None:
            m.mla_norm_eps = eps
        ref = m.forward(toks)
        scale = ref.abs().max().item()
        res[label] = {
            "prefill_max_abs": (lp - ref).abs().max().item(),
            "prefill_max_rel": (lp - ref).abs().max().item() / scale,
            "decode_max_abs": (ld - ref).abs().max().item(),
            "argmax_agree_prefill": float((lp.argmax(-1) == ref.argmax(-1)).double().mean()),
            "argmax_agree_decode": float((ld.argmax(-1) == ref.argmax(-1)).double().mean()),
            "ref_logit_std": ref.std().item(),
        }
        # variant: HF's released remote code (modeling_kimi.py) puts the correction bias into the weights
        m.router_bias_in_weights = True
        alt = m.forward(toks)
        res[label]["prefill_max_abs_if_bias_in_weights"] = (lp - alt).abs().max().item()
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
