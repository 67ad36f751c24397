#!/usr/bin/env python3
"""Independent oracle: flash-linear-attention's naive KDA (fla/ops/kda/naive.py) on seeded random inputs.

Not run by CI. fla's package import pulls Triton, so only that one file is loaded, from a checkout of
github.com/fla-org/flash-linear-attention kept OUTSIDE this repository (its code is never copied here):
  git -C <fla checkout> show <commit>:fla/ops/kda/naive.py > /work/oracle-src/fla_kda_naive.py
  /work/venv-oracle/bin/python python/oracles/fla_kda_naive.py \
      --naive /work/oracle-src/fla_kda_naive.py --fla-commit <commit>
(needs torch and einops). Writes tests/data/goldens/kda-fla/<case>/ with the inputs (q, k, v, g, beta,
initial state; layout [T, H, D] as k3's kernels take them, i.e. fla's [B=1, T, H, K]) and fla's outputs of
naive_recurrent_kda and naive_chunk_kda (o [T, H, D], final state [H, D, D] = fla's [H, K, V]). q and k are
L2-normalised as in the KDA layer (x / sqrt(sum x^2 + 1e-6)); q is NOT pre-scaled: fla applies its default
scale D^-0.5, and the C++ test (KdaOracle.*, test_kda.cpp) multiplies q by D^-0.5 before calling k3.
"""
import argparse
import importlib.util
import json
import os

import numpy as np
import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "kda-fla")

# name, T, H, D, fla chunk size, gate form (the two model families' gates), seed
CASES = [
    ("k3gate_t128_h2_d64", 128, 2, 64, 64, "k3", 11),
    ("klgate_t64_h2_d128", 64, 2, 128, 32, "kimi_linear", 12),
]


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def make_inputs(T, H, D, gate, seed):
    gen = torch.Generator().manual_seed(seed)
    n = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float32)  # noqa: E731
    q, k, v = l2norm(n(T, H, D)), l2norm(n(T, H, D)), n(T, H, D)
    if gate == "k3":  # g = lower_bound * sigmoid(.), lower bound -5 (spec 3.2, K3)
        g = -5.0 * torch.sigmoid(2.0 * n(T, H, D))
    else:  # g = -exp(A_log) * softplus(.) (Kimi-Linear)
        g = -torch.exp(0.5 * n(1, H, 1)) * torch.nn.functional.softplus(n(T, H, D))
    beta = torch.sigmoid(n(T, H))
    s0 = 0.3 * n(H, D, D)
    return dict(q=q, k=k, v=v, g=g, beta=beta, state0=s0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--naive", required=True, help="path of fla/ops/kda/naive.py, outside the repo")
    ap.add_argument("--fla-commit", required=True)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("fla_kda_naive", a.naive)
    fla = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fla)
    meta = {"oracle": "fla/ops/kda/naive.py: naive_recurrent_kda, naive_chunk_kda (fp32, CPU)",
            "fla_repo": "github.com/fla-org/flash-linear-attention", "fla_commit": a.fla_commit,
            "command": "/work/venv-oracle/bin/python python/oracles/fla_kda_naive.py --naive "
                       "/work/oracle-src/fla_kda_naive.py --fla-commit " + a.fla_commit,
            "torch": torch.__version__, "numpy": np.__version__, "cases": {}}
    for name, T, H, D, chunk, gate, seed in CASES:
        x = make_inputs(T, H, D, gate, seed)
        b = {k: v.unsqueeze(0) for k, v in x.items() if k != "state0"}
        s0 = x["state0"].unsqueeze(0)
        with torch.no_grad():
            o_rec, s_rec = fla.naive_recurrent_kda(b["q"], b["k"], b["v"], b["g"], b["beta"],
                                                   initial_state=s0.clone(), output_final_state=True)
            o_chk, s_chk = fla.naive_chunk_kda(b["q"], b["k"], b["v"], b["g"], b["beta"],
                                               initial_state=s0.clone(), output_final_state=True, chunk_size=chunk)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        for k, v in x.items():
            np.save(os.path.join(d, k + ".npy"), v.numpy().astype(np.float32))
        outs = {"o_recurrent": o_rec[0], "state_recurrent": s_rec[0], "o_chunk": o_chk[0], "state_chunk": s_chk[0]}
        for k, v in outs.items():
            np.save(os.path.join(d, k + ".npy"), v.numpy().astype(np.float32))
        rel = lambda p, r: float((p - r).abs().max() / r.abs().max())  # noqa: E731
        meta["cases"][name] = {"T": T, "H": H, "D": D, "fla_chunk_size": chunk, "gate": gate, "seed": seed,
                               "fla_chunk_vs_recurrent_o_rel": rel(o_chk, o_rec),
                               "fla_chunk_vs_recurrent_state_rel": rel(s_chk, s_rec)}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
