#!/bin/bash
# Quantised GGUF on the CPU: k3's exact tier (avx512) and its int8 tier (avx512bf16), optionally an older k3
# binary, against llama.cpp on the SAME file, 2 threads, alternating rounds with `uptime` before each run;
# then one table: best of the rounds per engine, ratios, and decode against the DRAM bound
# (gguf_token_bytes.py / bandwidth).
# usage (from the repo root): scripts/peer/q8-bench.sh GGUF [ROUNDS=2]
#   env: K3 (build/release/k3), K3_OLD (an older k3 binary, run with K3_CPU_ISA=avx512bf16; unset: skipped),
#        LLAMA_BIN (/work/llama-native/bin), BW (DRAM read GB/s, default 47: `k3 bench memory` -t 2 here),
#        P (512), N (128), TIERS ("avx512 avx512bf16"), THREADS (2; with 1, set BW to the 1-thread read rate)
set -u
GGUF=$1; ROUNDS=${2:-2}
K3=${K3:-build/release/k3}; K3_OLD=${K3_OLD:-}; LB=${LLAMA_BIN:-/work/llama-native/bin}
BW=${BW:-47}; P=${P:-512}; N=${N:-128}; TIERS=${TIERS:-"avx512 avx512bf16"}; TH=${THREADS:-2}
here=$(dirname "$0")
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
k3_run() {  # label binary isa
  echo "== $1 $(uptime)"
  K3_CPU_ISA=$3 $2 bench offline -m "$GGUF" -p $P -n $N -b 1 -r 3 -t $TH --mem-bw -1 2>/dev/null \
    | grep -E "^\| [^|]+ \| (pp|tg)[0-9]+ \|" | tee -a "$tmp/$1"
}
for r in $(seq 1 "$ROUNDS"); do
  for isa in $TIERS; do k3_run "k3-$isa" "$K3" "$isa"; done
  [ -n "$K3_OLD" ] && k3_run "k3-old-avx512bf16" "$K3_OLD" avx512bf16
  echo "== llama.cpp $(uptime)"
  "$LB/llama-bench" -m "$GGUF" -p $P -n $N -t $TH -r 3 -o md 2>/dev/null | grep -E "pp$P|tg$N" | tee -a "$tmp/llama"
done
best() { sort -g | tail -1; }
k3_best() { awk -F'|' -v t="$2" '$3 ~ t {split($6, a, " "); print a[1]}' "$tmp/$1" | best; }
ll_best() { awk -F'|' -v t="$1" '$0 ~ t {split($(NF-1), a, " "); print a[1]}' "$tmp/llama" | best; }
bytes=$(python3 "$here/gguf_token_bytes.py" "$GGUF" | awk '{print $1}')
llpp=$(ll_best "pp$P"); lltg=$(ll_best "tg$N")
echo
echo "$(basename "$GGUF"), $TH threads, best of $ROUNDS rounds; decode bound = $bytes weight bytes per token / $BW GB/s = $(awk -v b="$bytes" -v w="$BW" 'BEGIN{printf "%.1f", w * 1e9 / b}') tok/s"
echo "| engine | pp$P tok/s | vs llama | tg$N tok/s | vs llama | weights GB/s | % of DRAM bound |"
echo "|---|---|---|---|---|---|---|"
row() {  # label pp tg
  awk -v l="$1" -v pp="$2" -v tg="$3" -v lp="$llpp" -v lt="$lltg" -v b="$bytes" -v w="$BW" 'BEGIN {
    printf "| %s | %.1f | %.2fx | %.1f | %.2fx | %.1f | %.0f%% |\n", l, pp, (lp > 0 ? pp / lp : 0), tg, (lt > 0 ? tg / lt : 0),
           tg * b / 1e9, 100 * tg * b / (w * 1e9) }'
}
for f in "$tmp"/k3-*; do l=$(basename "$f"); row "$l" "$(k3_best "$l" "pp$P")" "$(k3_best "$l" "tg$N")"; done
row "llama.cpp" "$llpp" "$lltg"
