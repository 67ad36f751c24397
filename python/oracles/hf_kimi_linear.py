#!/usr/bin/env python3
"""Independent oracle: HF transformers' native `kimi_linear` on tests/data/tiny-kimi-linear.

Not run by CI (needs torch >= 2.6 and transformers >= 5 with models/kimi_linear; no fla needed: transformers
falls back to its own torch KDA / causal-conv code). Run by hand from the repository root, in a venv outside
the repo (docs/testing.md, "Independent oracles"):
  python3 -m venv /work/venv-oracle
  /work/venv-oracle/bin/pip install torch transformers==5.24.0 safetensors numpy einops
  /work/venv-oracle/bin/python python/oracles/hf_kimi_linear.py
Writes tests/data/goldens/tiny-kimi-linear-hf/: HF's fp32 logits of the golden tokens of tiny-kimi-linear
(one prefill call, and cached token-by-token decode) and meta.json (versions, command, and for information
the difference to k3ref float64 with HF's MLA norm eps). The C++ test is HfOracle.* (test_oracle_goldens.cpp).
"""
import json
import os
import platform
import sys

import numpy as np
import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CKPT = os.path.join(ROOT, "tests", "data", "tiny-kimi-linear")
OUT = os.path.join(ROOT, "tests", "data", "goldens", "tiny-kimi-linear-hf")


def hf_logits(toks):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([toks])
    with torch.no_grad():
        prefill = hf(input_ids=ids, use_cache=False).logits[0]
        out = hf(input_ids=ids[:, :1], use_cache=True)
        steps, pkv = [out.logits[0]], out.past_key_values
        for t in range(1, len(toks)):
            out = hf(input_ids=ids[:, t:t + 1], past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            steps.append(out.logits[0])
    # HF builds q_a/kv_a_layernorm with KimiLinearRMSNorm's default eps, not rms_norm_eps (docs/reference.md)
    mla_eps = {type(m).__name__ + ":" + n: m.variance_epsilon for n, m in hf.named_modules()
               if n.endswith("kv_a_layernorm") or n.endswith("q_a_layernorm")}
    return prefill.numpy().astype(np.float32), torch.cat(steps).numpy().astype(np.float32), mla_eps


def k3ref_diff(toks, prefill, mla_eps):
    """For information only: HF fp32 vs the project's own float64 reference at HF's MLA norm eps."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from k3ref.model import load_model
    m = load_model(CKPT, torch.float64)
    m.mla_norm_eps = mla_eps
    ref = m.forward(toks).numpy()
    return float(np.abs(prefill - ref).max() / np.abs(ref).max()), int((prefill.argmax(-1) == ref.argmax(-1)).sum())


def main():
    import transformers
    with open(os.path.join(ROOT, "tests", "data", "goldens", "tiny-kimi-linear", "tokens.json")) as f:
        toks = json.load(f)
    prefill, decode, mla_eps = hf_logits(toks)
    eps_values = sorted(set(mla_eps.values()))
    assert len(eps_values) == 1, mla_eps
    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "logits_prefill.npy"), prefill)
    np.save(os.path.join(OUT, "logits_decode.npy"), decode)
    rel_pd = float(np.abs(prefill - decode).max() / np.abs(prefill).max())
    rel_k3ref, argmax_k3ref = k3ref_diff(toks, prefill, eps_values[0])
    meta = {
        "oracle": "transformers models/kimi_linear (KimiLinearForCausalLM), fp32, eager attention, CPU, "
                  "torch fallbacks for KDA and the short conv (no fla / causal_conv1d installed)",
        "command": "/work/venv-oracle/bin/python python/oracles/hf_kimi_linear.py",
        "transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
        "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
        "checkpoint": "tests/data/tiny-kimi-linear", "tokens": "tests/data/goldens/tiny-kimi-linear/tokens.json",
        "files": {"logits_prefill.npy": "one call, use_cache=False",
                  "logits_decode.npy": "token-by-token with the HF cache (recurrent KDA path)"},
        "hf_mla_norm_eps": eps_values[0],
        "hf_prefill_vs_decode_rel": rel_pd,
        "hf_prefill_vs_k3ref_f64_rel_at_hf_eps": rel_k3ref,
        "hf_prefill_vs_k3ref_f64_argmax_agree": argmax_k3ref,
        "rel": "max |a-b| / max |b| over all 100 x 1024 logits",
    }
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
