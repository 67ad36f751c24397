#!/usr/bin/env python3
"""Where a decode step's wall time goes on the GPU, from `nsys stats -r cuda_gpu_trace -f csv` of a CUDA-graph run
(nsys profile --cuda-graph-trace=node): the last STEPS steps (a step starts at each embed_kernel launch), per kernel
name: launches, busy time, and the idle gap before each launch (the time since the previous kernel ended; negative
when PDL overlaps them). usage: nsys_step_gaps.py TRACE.csv [STEPS]"""
import csv
import sys
from collections import defaultdict


def short(name):
    name = name.split('(')[0]
    for p in ('void ', 'unnamed>::', '(anonymous namespace)::'):
        name = name.replace(p, '')
    return name[-70:]


def main():
    path, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            name = r.get('Name', '')
            if not name or 'memcpy' in name.lower() or 'memset' in name.lower():
                continue
            rows.append((int(r['Start (ns)']), int(r['Duration (ns)']), name))
    rows.sort()
    starts = [i for i, r in enumerate(rows) if 'embed_kernel' in r[2]]
    if len(starts) < steps + 1:
        sys.exit(f'only {len(starts)} embed_kernel launches')
    a, b = starts[-steps - 1], starts[-1]
    busy, gap, count = defaultdict(float), defaultdict(float), defaultdict(int)
    prev_end = rows[a - 1][0] + rows[a - 1][1] if a > 0 else rows[a][0]
    for s, d, n in rows[a:b]:
        k = short(n)
        busy[k] += d / 1e3 / steps
        gap[k] += (s - prev_end) / 1e3 / steps
        count[k] += 1
        prev_end = max(prev_end, s + d)
    wall = (rows[b][0] - rows[a][0]) / 1e3 / steps
    print(f'{steps} steps, {wall:.1f} us a step: busy {sum(busy.values()):.1f} us, gaps {sum(gap.values()):.1f} us')
    print(f"{'busy us':>9} {'gap us':>8} {'launches':>8}  kernel")
    for k in sorted(busy, key=lambda k: -(busy[k] + max(gap[k], 0))):
        print(f'{busy[k]:9.1f} {gap[k]:8.1f} {count[k] / steps:8.1f}  {k}')


if __name__ == '__main__':
    main()
