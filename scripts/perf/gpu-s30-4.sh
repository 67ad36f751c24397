#!/bin/bash
# session 30 call 4 (issues 15 / 18): where a batch-1 and a batch-8 decode step of llama.cpp's own Q4_K_M of the
# Kimi-Linear-dims 4-layer slice goes, per op category (K3_CUDA_PROFILE=1, eager): runs of 2 and 34 steps at depth 512,
# whose difference is 32 steps (the load, depth prefill and warm-up cancel). llama-quantize from a CPU-only build.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s30-4; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz && cd llama.cpp &&
  cmake -S . -B bq -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llamaq-cfg.log 2>&1 &&
  cmake --build bq -j6 --target llama-quantize > /tmp/llamaq-build.log 2>&1; echo "llama-quantize build rc=$? $(el)" > /tmp/llamaq.done ) &
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3
[ -x $B ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model; M=$BD/slice-kl; G=$M.gguf
KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_kl_slice.py $M > /tmp/ckpt.log 2>&1 &&
  $B convert -m $M -o $G > /tmp/convert.log 2>&1; echo "ckpt+gguf rc=$? $(el)"
while [ ! -f /tmp/llamaq.done ]; do sleep 1; done; cat /tmp/llamaq.done
Q=$BD/ll-q4km.gguf
timeout 100 $BD/llama.cpp/bq/bin/llama-quantize $G $Q Q4_K_M 16 > /tmp/llama-quantize.log 2>&1; echo "llama-quantize rc=$? $(el)"
for b in 1 8; do for n in 2 34; do
  echo "## b$b n$n" >> $O/$P-prof.txt
  K3_CUDA_PROFILE=1 timeout 60 $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 512 -b $b -r 1 --mem-bw -1 >> $O/$P-prof.txt 2>&1
  echo "b$b n$n rc=$? $(el)"
done; done
grep -c . $O/$P-prof.txt; echo "done $(el)"
