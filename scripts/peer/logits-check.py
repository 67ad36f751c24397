#!/usr/bin/env python3
"""Teacher-forced logits, k3 vs the llama.cpp peer: one prefill of BOS + the first N tokens of a text.
usage: logits-check.py CKPT_DIR BOS N TEXT_FILE GGUF [GGUF...]; prints max |diff|, max rel to max |logit|,
top-1 agreement and mean KL(k3 || llama) per GGUF. env: K3 (build/release/k3), PEERDUMP."""
import os, subprocess, sys
import numpy as np
peerdump = os.environ.get("PEERDUMP", "/work/gate/peer/peerdump")  # built from peerdump.cpp, outside the repo
ckpt, bos, n, text_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ggufs = sys.argv[5:]
text = open(text_file, encoding="utf-8", errors="ignore").read()[: n * 8]
ids = [int(x) for x in subprocess.run([peerdump, ggufs[0], "tok", text], capture_output=True, text=True,
                                      check=True).stdout.strip().split(",")][: n - 1]
ids = [bos] + ids
s = ",".join(map(str, ids))
subprocess.run([os.environ.get("K3", "build/release/k3"), "logits", "-m", ckpt, "--tokens", s, "--out", "/tmp/lc_k3.npy", "-t", "2"],
               check=True, capture_output=True)
k = np.load("/tmp/lc_k3.npy").astype(np.float64)
def lsm(x): x = x - x.max(-1, keepdims=True); return x - np.log(np.exp(x).sum(-1, keepdims=True))
for g in ggufs:
    subprocess.run([peerdump, g, "logits", s, "/tmp/lc_l.bin"], check=True, capture_output=True)
    l = np.fromfile("/tmp/lc_l.bin", dtype=np.float32).reshape(k.shape).astype(np.float64)
    d = np.abs(k - l)
    top1 = (k.argmax(-1) == l.argmax(-1)).mean()
    pk, pl = lsm(k), lsm(l)
    kl = (np.exp(pk) * (pk - pl)).sum(-1).mean()
    print(f"{os.path.basename(g)}: {len(ids)} positions, max|diff| {d.max():.3g} (rel {d.max() / np.abs(k).max():.2g}), "
          f"mean|diff| {d.mean():.3g}, top-1 agree {top1 * 100:.1f}%, mean KL(k3||llama) {kl:.3g}")
