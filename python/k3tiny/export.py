#!/usr/bin/env python3
"""Trained k3-tiny weights -> HF checkpoint directory in the exact Kimi K3 layout (model-spec sections 1, 2, 4).

  python3 python/k3tiny/export.py --ckpt out/k3tiny/final.pt --out out/k3tiny/hf [--bf16-experts] [--tokenizer DIR]

Dtypes as in the real checkpoint (and python/k3ref/checkpoint.py): BF16 for every projection, embedding, norm,
AttnRes vector and lm_head; F32 for *_conv1d.weight [C,1,4], dt_bias [C], A_log [128] (zero-padded past Hk)
and gate.e_score_correction_bias [E]; routed experts experts.{e}.w{1,2,3} as MXFP4 weight_packed U8 +
weight_scale U8 (k3ref.mxfp4.quantize of the fp32 master weights), or plain BF16 .weight with --bf16-experts
(then config.json has no quantization_config).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import OrderedDict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from k3ref import mxfp4  # noqa: E402
from k3ref.checkpoint import save_hf_dir  # noqa: E402
from k3ref.safetensors_io import BF16Array  # noqa: E402

TOKENIZER_FILES = ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")
F32_SUFFIXES = ("conv1d.weight", "dt_bias", "A_log", "e_score_correction_bias")


def hf_arrays(tensors, mxfp4_experts: bool) -> "OrderedDict[str, object]":
    """{hf name: fp32 torch tensor} -> {hf name: BF16Array | np array} in the checkpoint dtypes."""
    out = OrderedDict()
    for name in sorted(tensors, key=_order_key):
        a = tensors[name].detach().cpu().float().numpy()
        if ".experts." in name and name.endswith(".weight") and mxfp4_experts:
            pk, sc = mxfp4.quantize(a)
            base = name[: -len(".weight")]
            out[base + ".weight_packed"] = pk
            out[base + ".weight_scale"] = sc
        elif name.endswith(F32_SUFFIXES):
            out[name] = np.ascontiguousarray(a, dtype=np.float32)
        else:
            out[name] = BF16Array.from_f32(a)
    return out


def _order_key(n):
    import re
    m = re.search(r"layers\.(\d+)\.", n)
    return (int(m.group(1)) if m else 10 ** 6, n)


def export(tensors, cfgd: dict, outdir: str, mxfp4_experts: bool = True, tokenizer_dir: str = None) -> dict:
    from k3tiny.k3tiny_cfg import without_quant
    cfgd = cfgd if mxfp4_experts else without_quant(cfgd)
    if mxfp4_experts and "quantization_config" not in cfgd["text_config"]:
        raise ValueError("config has no quantization_config but MXFP4 export requested")
    arrs = hf_arrays(tensors, mxfp4_experts)
    save_hf_dir(outdir, cfgd, arrs, 1, metadata={"format": "pt"})
    copied = []
    if tokenizer_dir and os.path.isdir(tokenizer_dir):
        for fn in TOKENIZER_FILES:
            p = os.path.join(tokenizer_dir, fn)
            if os.path.exists(p):
                shutil.copy(p, os.path.join(outdir, fn))
                copied.append(fn)
    size = os.path.getsize(os.path.join(outdir, "model.safetensors"))
    return {"dir": outdir, "tensors": len(arrs), "bytes": size, "tokenizer_files": copied}


def load_trained(ckpt_path: str):
    """-> (K3Tiny model on CPU fp32, config dict)."""
    import torch
    from k3ref.config import parse_config
    from k3tiny.model_train import K3Tiny
    try:
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    except TypeError:   # torch < 1.13 has no weights_only
        ck = torch.load(ckpt_path, map_location="cpu")
    cfgd = ck["config"]
    m = K3Tiny(parse_config(cfgd))
    m.load_state_dict(ck["model"])
    return m, cfgd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True, help="final.pt written by train.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bf16-experts", action="store_true", help="unquantised variant (no quantization_config)")
    ap.add_argument("--tokenizer", default=None, help="dir with tiktoken.model / tokenizer_config.json / chat_template.jinja")
    a = ap.parse_args()
    m, cfgd = load_trained(a.ckpt)
    r = export(m.hf_tensors(), cfgd, a.out, not a.bf16_experts, a.tokenizer)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
