#!/usr/bin/env python3
"""Quality of an activation-rounding CPU tier against the exact one (docs/perf/cpu.md, issue 14).

Teacher-forced next-token distributions of the same tokens under two K3_CPU_ISA tiers (one prefill each,
`k3 logits`), then: perplexity of each over the text, mean / max KL(exact || other) of the next-token
distributions, and top-1 agreement. By hand (not CI): it runs the model twice.

usage: scripts/perf/tier_kl.py K3_BIN MODEL_DIR TEXT_FILE [N_TOKENS=300] [EXACT=avx512] [OTHER=avx512bf16]
"""
import json, os, subprocess, sys, tempfile

import numpy as np


def logits(k3, model, ids, isa, out):
    env = dict(os.environ, K3_CPU_ISA=isa)
    subprocess.run([k3, "logits", "-m", model, "--tokens", ",".join(map(str, ids)), "--out", out], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return np.load(out).astype(np.float64)


def log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def main():
    k3, model, text = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    exact = sys.argv[5] if len(sys.argv) > 5 else "avx512"
    other = sys.argv[6] if len(sys.argv) > 6 else "avx512bf16"
    with open(text, encoding="utf-8") as f:
        body = f.read()[:20 * n]
    ids = json.loads(subprocess.run([k3, "tokenize", "-m", model], input=body, capture_output=True, text=True,
                                    check=True).stdout)[:n]
    with tempfile.TemporaryDirectory() as d:
        a = log_softmax(logits(k3, model, ids, exact, f"{d}/a.npy"))
        b = log_softmax(logits(k3, model, ids, other, f"{d}/b.npy"))
    tgt = np.array(ids[1:])
    rows = np.arange(len(tgt))
    ppl = lambda lp: float(np.exp(-lp[:-1][rows, tgt].mean()))
    kl = (np.exp(a) * (a - b)).sum(axis=1)
    top1 = float((a.argmax(axis=1) == b.argmax(axis=1)).mean())
    print(f"{os.path.basename(model.rstrip('/'))} {len(ids)} tokens of {os.path.basename(text)}: "
          f"ppl {exact} {ppl(a):.4f} {other} {ppl(b):.4f} | KL({exact}||{other}) mean {kl.mean():.3e} "
          f"max {kl.max():.3e} | top-1 agreement {100 * top1:.1f}%")


if __name__ == "__main__":
    main()
