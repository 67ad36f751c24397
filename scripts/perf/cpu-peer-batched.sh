#!/bin/bash
# k3 against llama.cpp's CPU build on the same GGUF, same box, alternating rounds: decode at batch 1 / 2 / 4 / 8 at
# depth 64 (k3 `bench offline -d 64 -p 0 -n 32`, llama.cpp `llama-batched-bench -npp 64 -ntg 32`: S_TG), with the
# box's read rate (`k3 bench memory`) before and after -- it moves with the neighbours on shared dev boxes.
#   scripts/perf/cpu-peer-batched.sh K3_BIN LLAMA_BIN_DIR GGUF THREADS ROUNDS > log
# llama.cpp: built from source for the comparison only (never committed); the commit goes in the log's header.
set -u
K3=$1 LB=$2 G=$3 T=${4:-2} R=${5:-2}
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo) threads $T; llama.cpp ${LLAMA_COMMIT:-?}; $G"
mem() { $K3 bench memory -t $T 2>&1 | grep -iE 'GB/s' | tail -1; }
echo "## memory: $(mem)"
for r in $(seq 1 $R); do
  echo "## round $r k3"
  $K3 bench offline -m $G -d 64 -p 0 -n 32 -b 1,2,4,8 -r 2 -t $T --no-mmap 2>&1 | grep -E "^\| [^ ]+\.gguf .*tg32"
  echo "## round $r llama.cpp"
  $LB/llama-batched-bench -m $G -t $T -tb $T -c 4096 -b 2048 -ub 512 -npp 64 -ntg 32 -npl 1,2,4,8 2>&1 | grep -E '^\|'
  echo "## memory: $(mem)"
done
