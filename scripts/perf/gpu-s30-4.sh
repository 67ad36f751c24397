#!/bin/bash
# session 30 call 4 (issues 15 / 18): where a batch-1 and a batch-8 decode step of llama.cpp's own Q4_K_M of the
# Kimi-Linear-dims 4-layer slice goes, per op category (K3_CUDA_PROFILE=1, eager): runs of 2 and 34 steps at depth 512,
# whose difference is 32 steps, twice (the bench warms up with the same run; load and depth prefill cancel).
# llama-quantize from a CPU-only build (scripts/perf/lib-gguf-slice.sh; the call ran this recipe inline).
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s30-4; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3
[ -x $B ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
kl_slice_q4km $B; Q=$BD/ll-q4km.gguf
for b in 1 8; do for n in 2 34; do
  echo "## b$b n$n" >> $O/$P-prof.txt
  K3_CUDA_PROFILE=1 timeout 60 $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 512 -b $b -r 1 --mem-bw -1 >> $O/$P-prof.txt 2>&1
  echo "b$b n$n rc=$? $(el)"
done; done
grep -c . $O/$P-prof.txt; echo "done $(el)"
