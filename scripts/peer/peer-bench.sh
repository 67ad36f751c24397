#!/bin/bash
# k3 vs the llama.cpp peer on the same weights (CPU, 2 threads), alternating, with uptime before each run.
# usage (from the repo root): scripts/peer/peer-bench.sh MODEL_DIR GGUF [ROUNDS=2]
#   env: K3=k3 binary (build/release/k3), LLAMA_BIN=peer bin dir (/work/llama-native/bin), BATCHED=0 skips b=8
# Prints every run's rows and a summary: best (max) of the rounds per engine and the ratios k3/llama.
set -u
DIR=$1; GGUF=$2; ROUNDS=${3:-2}
K3=${K3:-build/release/k3}
LB=${LLAMA_BIN:-/work/llama-native/bin}
BATCHED=${BATCHED:-1}
T=2
tmp=$(mktemp -d); trap 'rm -rf $tmp' EXIT
for r in $(seq 1 $ROUNDS); do
  echo "== round $r k3   $(uptime)"
  $K3 bench offline -m "$DIR" -p 512 -n 128 -b 1 -r 3 -t $T 2>/dev/null | grep -E '^\| [^|]+ \| (pp|tg)[0-9]+ \|' | tee -a $tmp/k3
  echo "== round $r llama $(uptime)"
  $LB/llama-bench -m "$GGUF" -p 512 -n 128 -t $T -r 3 -o md 2>/dev/null | grep -E 'pp512|tg128' | tee -a $tmp/ll
  if [ "$BATCHED" = 1 ]; then
    echo "== round $r k3 b=8   $(uptime)"
    $K3 bench offline -m "$DIR" -p 128 -n 128 -b 8 -r 1 -t $T 2>/dev/null | grep -E '^\| [^|]+ \| (pp|tg)[0-9]+ \|' | tee -a $tmp/k3b
    echo "== round $r llama-batched-bench npl=8   $(uptime)"
    $LB/llama-batched-bench -m "$GGUF" -c 2304 -b 1024 -ub 512 -npp 128 -ntg 128 -npl 8 -t $T -tb $T 2>/dev/null \
      | grep -E '^\|\s+128' | tee -a $tmp/llb
  fi
done
best() { sort -g | tail -1; }
k3pp=$(awk -F'|' '$3 ~ /pp512/ {split($6,a," "); print a[1]}' $tmp/k3 | best)
k3tg=$(awk -F'|' '$3 ~ /tg128/ {split($6,a," "); print a[1]}' $tmp/k3 | best)
llpp=$(awk -F'|' '/pp512/ {n=split($(NF-1),a," "); print a[1]}' $tmp/ll | best)
lltg=$(awk -F'|' '/tg128/ {n=split($(NF-1),a," "); print a[1]}' $tmp/ll | best)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo "SUMMARY $(basename "$DIR") best of $ROUNDS: pp512 k3 $k3pp llama $llpp ratio $(ratio "$k3pp" "$llpp") | tg128 k3 $k3tg llama $lltg ratio $(ratio "$k3tg" "$lltg")"
if [ "$BATCHED" = 1 ]; then
  # llama-batched-bench columns: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
  k3bpp=$(awk -F'|' '$3 ~ /pp128/ {split($6,a," "); print a[1]}' $tmp/k3b | best)
  k3btg=$(awk -F'|' '$3 ~ /tg128/ {split($6,a," "); print a[1]}' $tmp/k3b | best)
  llbpp=$(awk -F'|' '{gsub(/ /,"",$7); print $7}' $tmp/llb | best)
  llbtg=$(awk -F'|' '{gsub(/ /,"",$9); print $9}' $tmp/llb | best)
  echo "SUMMARY-B8 $(basename "$DIR") best of $ROUNDS (8 seqs, total tok/s): pp128x8 k3 $k3bpp llama $llbpp ratio $(ratio "$k3bpp" "$llbpp") | tg128x8 k3 $k3btg llama $llbtg ratio $(ratio "$k3btg" "$llbtg")"
fi
