#!/bin/bash
# Greedy continuation: k3 run --temp 0 vs peerdump gen on GGUF; exact text equality of N tokens per prompt.
# usage: gen-check.sh CKPT_DIR GGUF BOS N   (env: K3 = k3 binary, PEERDUMP = peerdump binary)
D=$1; G=$2; BOS=$3; N=${4:-64}
PD=${PEERDUMP:-/work/gate/peer/peerdump}  # built from peerdump.cpp, outside the repo
for P in "The capital of France is" "In the beginning God created the heaven and the earth." "def fibonacci(n):" "Once upon a time, in a small village,"; do
  ids=$($PD "$G" tok "$P")
  $PD "$G" gen "$BOS,$ids" $N | tail -n +2 > /tmp/peer_gen_l.txt
  ${K3:-build/release/k3} run -m "$D" -p "$P" -n $N --temp 0 -t 2 2>/dev/null > /tmp/peer_gen_k.txt
  python3 - "$P" <<'PY'
import sys
p = sys.argv[1]
l = open('/tmp/peer_gen_l.txt', encoding='utf-8', errors='replace').read().rstrip('\n')
k = open('/tmp/peer_gen_k.txt', encoding='utf-8', errors='replace').read()
k = k[len(p):] if k.startswith(p) else k
k = k.rstrip('\n')
if l == k: print(f"EQUAL ({len(k)} chars): {p!r}")
else:
    i = next((i for i, (a, b) in enumerate(zip(l, k)) if a != b), min(len(l), len(k)))
    print(f"DIFF at char {i} of {len(k)}: {p!r}\n  llama: {l[max(0,i-20):i+40]!r}\n  k3   : {k[max(0,i-20):i+40]!r}")
PY
done
