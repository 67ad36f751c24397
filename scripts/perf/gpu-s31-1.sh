#!/bin/bash
# Ready for session 31 (issues 15 / 18): the per-kernel split of a batch-1 and a batch-8 decode step on llama.cpp's own
# Q4_K_M of the Kimi-Linear-dims 4-layer slice (call s30-3's ncu run of 5 steps at depth 512 timed out: here depth 64
# and 2 vs 4 steps, one metric pass), to say which GGUF projections hold batches 1-8 below 1.5x llama.cpp.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s31-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3
[ -x $B ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
kl_slice_q4km $B; Q=$BD/ll-q4km.gguf
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for b in 1 8; do for n in 2 4; do
  timeout 120 $NCU --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --log-file /tmp/ncu-b$b-n$n.csv \
    $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 64 -b $b -r 1 --mem-bw -1 > /dev/null 2>&1
  echo "ncu b$b n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b$b-n2.csv /tmp/ncu-b$b-n4.csv 4 > $O/$P-ncu-b$b-step.txt 2>&1  # 2 steps x (warm-up + run)
head -25 $O/$P-ncu-b$b-step.txt | cut -c1-170; done
echo "done $(el)"
