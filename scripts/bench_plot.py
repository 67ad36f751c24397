#!/usr/bin/env python3
"""Latency-throughput curves of `k3 bench serve` results (docs/bench.md).

usage: python3 scripts/bench_plot.py [-o out.png] [--title T] RESULT.json...
       (or `k3 bench plot RESULT.json... -o out.png`)

Each result file is one run or a sweep ({"sweep": [...]}); every file becomes one curve. Left: P90
TTFT, right: median (P50) TPOT, both against max concurrency, with the output-token throughput of
each point written next to it. Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import os
import sys


def load(path):
    with open(path) as f:
        j = json.load(f)
    runs = j["sweep"] if "sweep" in j else [j]
    label = j.get("label") or os.path.splitext(os.path.basename(path))[0]
    pts = []
    for r in runs:
        c = r.get("max_concurrency") or r.get("num_prompts")
        pts.append((c, r["p90_ttft_ms"], r["median_tpot_ms"], r["output_throughput"], r["request_throughput"]))
    pts.sort()
    return label, pts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("-o", "--output", default="bench.png")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("bench_plot.py: matplotlib is missing (pip install matplotlib)")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for path in a.results:
        label, pts = load(path)
        cs = [p[0] for p in pts]
        ax1.plot(cs, [p[1] for p in pts], "o-", label=label)
        ax2.plot(cs, [p[2] for p in pts], "o-", label=label)
        for c, ttft, tpot, otp, _ in pts:
            ax2.annotate(f"{otp:.0f} tok/s", (c, tpot), textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax1.annotate(f"{otp:.0f} tok/s", (c, ttft), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for ax, name in ((ax1, "P90 TTFT (ms)"), (ax2, "P50 TPOT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(a.title or "k3 bench serve: latency vs. concurrency (labels: output tok/s)")
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)
    print(f"bench_plot.py: wrote {a.output}")


if __name__ == "__main__":
    main()
