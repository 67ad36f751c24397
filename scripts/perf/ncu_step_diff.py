#!/usr/bin/env python3
"""Per-kernel GPU time of decode steps from two ncu CSV logs of the same bench run with different step counts.

ncu --csv --metrics gpu__time_duration.sum[,dram__bytes_read.sum] --log-file A.csv k3 bench offline ... -n 2
ncu ... --log-file B.csv k3 bench offline ... -n 5
scripts/perf/ncu_step_diff.py A.csv B.csv 3     # 3 = the step-count difference: prints us and MB per step

Everything the two runs share (load, the depth prefill, warm-up) cancels in the difference; kernels are grouped by
name (template arguments kept, so each instantiation is its own row), largest first.
"""
import csv
import gzip
import sys
from collections import defaultdict


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", errors="replace") as f:
            lines = [l for l in f if l.startswith('"')]
    except (OSError, EOFError) as e:  # a missing, unreadable or corrupted (.gz) log
        sys.exit(f"{path}: {e}")
    t, b, n = defaultdict(float), defaultdict(float), defaultdict(int)
    reader = csv.DictReader(lines)
    if not lines or not {"Kernel Name", "Metric Name", "Metric Value"} <= set(reader.fieldnames or []):
        sys.exit(f"{path}: not an `ncu --csv` metrics log (no Kernel Name / Metric Name / Metric Value columns)")
    for row in reader:
        name, metric, val = row["Kernel Name"], row["Metric Name"], (row["Metric Value"] or "").replace(",", "")
        try:
            v = float(val)
        except ValueError:
            continue
        if metric == "gpu__time_duration.sum":
            t[name] += v * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(row.get("Metric Unit"), 1.0)  # -> us
            n[name] += 1
        elif metric == "dram__bytes_read.sum":
            b[name] += v * {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}.get(row.get("Metric Unit"), 1e-6)
    return t, b, n


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    (ta, ba, na), (tb, bb, nb) = load(sys.argv[1]), load(sys.argv[2])
    try:
        steps = float(sys.argv[3])
    except ValueError:
        steps = 0.0
    if not steps > 0 or steps == float("inf"):
        sys.exit(f"step-count difference must be a positive number, got {sys.argv[3]!r}")
    rows = []
    for k in set(ta) | set(tb):
        dt = (tb.get(k, 0) - ta.get(k, 0)) / steps
        if abs(dt) < 0.05:
            continue
        rows.append((dt, (bb.get(k, 0) - ba.get(k, 0)) / steps, (nb.get(k, 0) - na.get(k, 0)) / steps, k))
    rows.sort(reverse=True)
    # A kernel with no extra launches per step ran only in the shared part (load, depth prefill): its time
    # difference is run-to-run jitter, not decode; reported apart.
    jitter = [r for r in rows if r[2] < 0.5]
    rows = [r for r in rows if r[2] >= 0.5]
    total = sum(r[0] for r in rows)
    print(f"{'us/step':>9} {'share':>6} {'MB/step':>8} {'GB/s':>6} {'launches':>8}  kernel")
    for dt, mb, cnt, k in rows:
        gbs = mb / dt * 1e3 if dt > 0 else 0.0  # MB per us = TB/s; x 1e3 -> GB/s
        print(f"{dt:9.1f} {100 * dt / total if total > 0 else 0.0:5.1f}% {mb:8.2f} {gbs:6.0f} {cnt:8.1f}  {k[:110]}")
    print(f"{total:9.1f} total us per step")
    if jitter:
        print(f"(not per step: {len(jitter)} kernels of the shared part, net {sum(r[0] for r in jitter):.1f} us of jitter)")


if __name__ == "__main__":
    main()
