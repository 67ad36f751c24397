#!/usr/bin/env python3
"""Perplexity of exported k3-tiny checkpoints, computed with the project's reference model (python/k3ref).

  python3 python/k3tiny/evaluate.py --model out/k3tiny/hf out/k3tiny/hf-bf16 --tokens data/k3tiny/val.bin --ctx 512
  python3 python/k3tiny/evaluate.py --model out/k3tiny/hf --text some.txt --ctx 512     (needs tiktoken)

PERPLEXITY RULE (the C++ `k3 perplexity -f FILE --ctx N` uses the same rule):
  1. tokens: a text file is tokenised as a whole with encode_ordinary (plain BPE, no special tokens, no BOS);
     a .bin file is read as little-endian uint16 token ids as they are.
  2. split the tokens into consecutive, non-overlapping windows of N tokens: [0,N), [N,2N), ...; the last
     window may be shorter (it is kept if it has at least 1 token). --max-windows K keeps the first K windows.
  3. each window is evaluated from a fresh state (no context carried over) on the input [BOS] + window
     (N+1 tokens); the logits at input position j predict window token j, so every token of the file is
     predicted exactly once, the first one of each window from BOS alone.
  4. NLL_t = -log softmax(logits)[token] (float64 log-softmax of the model's logits); the reported value is
     ppl = exp(sum of all NLL_t / number of predicted tokens), plus mean NLL in nats and bits per token.
--impl ref (default) runs k3ref (CPU, float32, chunked KDA); --impl fast runs the training model
(python/k3tiny/model_train.py, batched, CUDA if available, float32) on the same exported weights.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from k3ref.config import load_config  # noqa: E402


def tokenize_text(path, tok_dir):
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        sys.exit("evaluate.py: tokenising text needs tiktoken; pass a uint16 .bin token file with --tokens instead")
    import base64
    import tiktoken
    sys.path.insert(0, os.path.dirname(HERE))
    from gen_tokenizer_goldens import KIMI_PAT
    ranks = {}
    with open(os.path.join(tok_dir, "tiktoken.model"), "rb") as f:
        for line in f:
            if line.strip():
                b, r = line.split()
                ranks[base64.b64decode(b)] = int(r)
    enc = tiktoken.Encoding("k3tiny", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens={})
    with open(path, encoding="utf-8") as f:
        return enc.encode_ordinary(f.read())


def windows(tokens, ctx, max_windows=None):
    ws = [tokens[i:i + ctx] for i in range(0, len(tokens), ctx)]
    ws = [w for w in ws if len(w) >= 1]
    return ws[:max_windows] if max_windows else ws


def nll_sum(logits, targets):
    lp = torch.log_softmax(logits.double(), -1)
    return float(-lp.gather(-1, targets.view(-1, 1)).sum())


def ppl_ref(model_dir, ws, bos):
    from k3ref.model import load_model
    m = load_model(model_dir, dtype=torch.float32)
    tot, n = 0.0, 0
    for w in ws:
        lg = m.forward([bos] + list(w), kda_mode="chunk")
        tot += nll_sum(lg[:len(w)], torch.as_tensor(w, dtype=torch.long))
        n += len(w)
    return tot, n


def ppl_fast(model_dir, ws, bos, device):
    from k3ref.model import load_model
    from k3tiny.model_train import K3Tiny
    ref = load_model(model_dir, dtype=torch.float32)
    m = K3Tiny(ref.cfg)
    m.load_hf_tensors(ref.w)
    m.to(device).eval()
    tot, n = 0.0, 0
    by_len = {}
    for w in ws:
        by_len.setdefault(len(w), []).append(w)
    with torch.no_grad():
        for L, group in by_len.items():
            for i in range(0, len(group), 16):
                g = group[i:i + 16]
                x = torch.tensor([[bos] + list(w) for w in g], dtype=torch.long, device=device)
                lg = m(x)[:, :L].cpu()
                tot += nll_sum(lg.reshape(-1, lg.shape[-1]), torch.tensor(g, dtype=torch.long).reshape(-1))
                n += L * len(g)
    return tot, n


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", nargs="+", required=True, help="exported checkpoint dir(s)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="uint16 little-endian token file")
    src.add_argument("--text", help="UTF-8 text file (tokenised with encode_ordinary; needs tiktoken)")
    ap.add_argument("--tokenizer", default=None, help="dir with tiktoken.model (default: the first --model dir)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--impl", choices=("ref", "fast"), default="ref")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    if a.tokens:
        toks = np.fromfile(a.tokens, dtype="<u2").astype(np.int64).tolist()
    else:
        toks = tokenize_text(a.text, a.tokenizer or a.model[0])
    ws = windows(toks, a.ctx, a.max_windows or None)
    results = []
    for d in a.model:
        cfg = load_config(d)
        t0 = time.time()
        if a.impl == "ref":
            tot, n = ppl_ref(d, ws, cfg.bos_token_id)
        else:
            tot, n = ppl_fast(d, ws, cfg.bos_token_id, a.device)
        r = {"model": d, "mxfp4_experts": cfg.mxfp4_experts, "ctx": a.ctx, "windows": len(ws), "tokens": n,
             "nll": tot / n, "bits_per_token": tot / n / math.log(2), "ppl": math.exp(tot / n),
             "seconds": round(time.time() - t0, 1), "impl": a.impl}
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


if __name__ == "__main__":
    main()
