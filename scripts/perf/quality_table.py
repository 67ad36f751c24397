#!/usr/bin/env python3
"""Markdown table of `k3 perplexity --kl-divergence --json` results collected as JSON lines (scripts/perf/gpu-s28-2.sh):
  python3 scripts/perf/quality_table.py --params 104227328 docs/perf/quant/s28-2-quality.jsonl [more.jsonl ...]
One row per line, in file order; bits per weight = file bytes x 8 / the model's parameter count (GGUF metadata and
tokenizer included, so slightly high)."""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("--params", type=int, required=True)
ap.add_argument("files", nargs="+")
a = ap.parse_args()
print("| file | tool | bytes | bits/weight | PPL ratio | KLD mean | median | p99 | p99.9 | same top-1 | RMS dp |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for f in a.files:
    for line in open(f):
        r = json.loads(line)
        print(f"| {r['preset']} | {r['tool']} | {r['bytes']:,} | {r['bytes'] * 8 / a.params:.2f} | {r['ppl_ratio']:.4f} | "
              f"{r['kld_mean']:.4f} | {r['kld_median']:.4f} | {r['kld_p99']:.3f} | {r['kld_p99_9']:.3f} | "
              f"{100 * r['same_top1']:.2f}% | {r['rms_dp']:.4f} |")
