#!/usr/bin/env python3
"""Summarise ncu's per-instruction warp-state samples of one kernel (the CSV of `ncu --section SourceCounters
--section WarpStateStats --page source --print-source sass --csv`, optionally .xz): samples by stall reason, by opcode
(with the warp instructions executed), the hottest instructions, and -- with --regions -- by address range.

  scripts/perf/ncu_source_stalls.py docs/perf/cuda/s64-1-ncu-ring-source.csv.xz
  scripts/perf/ncu_source_stalls.py FILE --top 30 --regions barrier:f0b70-f0ce0,copies:f0ce0-f0f10

Region bounds are the low hex digits of the addresses (as ncu prints them: the kernel's load address differs per run,
its low digits do not). Written for session 64's reading of the ring's gate+up (docs/perf/cuda.md)."""
import argparse
import collections
import csv
import io
import lzma
import re
import sys


def read_rows(path):
    try:
        with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as raw:
            lines = raw.read().splitlines()
    except (OSError, UnicodeDecodeError, lzma.LZMAError) as e:
        sys.exit(f"{path}: not a readable ncu CSV ({e})")
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu source table (a header starting with \"Address\")")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    body = [r for r in rows[1:] if len(r) == len(rows[0])]
    if len(body) < len(rows) - 1:
        print(f"{path}: {len(rows) - 1 - len(body)} rows of another width skipped", file=sys.stderr)
    return rows[0], body


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(sass):
    words = sass.split()
    if not words:
        return ""
    w = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return w.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20, help="hottest instructions listed (default 20)")
    ap.add_argument("--regions", default="", help="NAME:LO-HI,... address ranges (low hex digits) to total")
    ap.add_argument("--bodies", action="store_true",
                    help="samples and HGMMAs by tile body: each instruction goes to the body of the nearest HGMMA shape "
                         "(64xN) at or after its address less 0x800 (the ring's bodies are laid out one after another)")
    a = ap.parse_args()
    head, rows = read_rows(a.csv)
    col = {n: i for i, n in enumerate(head)}
    for need in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in col:
            sys.exit(f"{a.csv}: column '{need}' missing (was the CSV written with --page source --print-source sass?)")
    reasons = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
    samples = lambda r: num(r[col["Warp Stall Sampling (All Samples)"]])
    executed = lambda r: num(r[col["Instructions Executed"]])
    total = sum(samples(r) for r in rows)
    if total <= 0:
        sys.exit(f"{a.csv}: no samples")
    by_reason = collections.Counter({n: sum(num(r[col[n]]) for r in rows) for n in reasons})
    print(f"{len(rows)} instructions, {total:.0f} samples, {sum(executed(r) for r in rows):.4g} warp instructions executed\n")
    print("by stall reason:")
    for n, v in by_reason.most_common():
        if v > 0:
            print(f"  {n[6:]:20s} {v:10.0f} {100 * v / total:5.1f}%")
    ops, ops_ex = collections.Counter(), collections.Counter()
    for r in rows:
        o = opcode(r[col["Source"]])
        ops[o] += samples(r)
        ops_ex[o] += executed(r)
    print("\nby opcode (samples, share, warp instructions executed):")
    for o, v in ops.most_common(25):
        print(f"  {o:12s} {v:10.0f} {100 * v / total:5.1f}% {ops_ex[o]:14.0f}")
    print(f"\nhottest {a.top} instructions (address, samples, executed, SASS, leading reasons):")
    for r in sorted(rows, key=lambda r: -samples(r))[: a.top]:
        lead = sorted(((num(r[col[n]]), n[6:]) for n in reasons), reverse=True)[:2]
        why = ", ".join(f"{w} {v:.0f}" for v, w in lead if v > 0)
        print(f"  {r[0][-5:]} {samples(r):8.0f} {executed(r):11.0f}  {r[col['Source']].strip()[:64]:64s} {why}")
    if a.bodies:
        spans = collections.defaultdict(list)
        for r in rows:
            m = re.search(r"HGMMA\.64x(\d+)x", r[col["Source"]])
            if m:
                spans["n" + m.group(1)].append(int(r[0], 16))
        starts = sorted((min(v), k) for k, v in spans.items())
        body_s, body_h = collections.Counter(), collections.Counter()
        for r in rows:
            x, lab = int(r[0], 16), "before"
            for lo, k in starts:
                if x >= lo - 0x800:
                    lab = k
            body_s[lab] += samples(r)
            if opcode(r[col["Source"]]) == "HGMMA":
                body_h[lab] += executed(r)
        h_total = sum(body_h.values()) or 1
        print("\nby tile body (samples, share; HGMMAs executed, share -- every tile issues the same number):")
        for k, v in body_s.most_common():
            print(f"  {k:8s} {v:10.0f} {100 * v / total:5.1f}% {body_h[k]:12.0f} {100 * body_h[k] / h_total:5.1f}%")
    if a.regions:
        print("\nby region (samples, share, instructions, warp instructions executed):")
        for spec in a.regions.split(","):
            try:
                name, rng = spec.split(":")
                los, his = rng.split("-")
                lo, hi = int(los, 16), int(his, 16)
            except ValueError:
                sys.exit(f"--regions: '{spec}' is not NAME:LO-HI with hex LO, HI (e.g. copies:f0ce0-f0f10)")
            width = 16 ** max(len(los), len(his))
            sel = [r for r in rows if lo <= int(r[0], 16) % width < hi]
            s = sum(samples(r) for r in sel)
            print(f"  {name:12s} {s:10.0f} {100 * s / total:5.1f}% {len(sel):6d} {sum(executed(r) for r in sel):14.0f}")


if __name__ == "__main__":
    main()
