#!/bin/bash
# session 38 call 1 (issue 18): the same-card H200 table of the K3-dimension slice against llama.cpp, on ONE file.
# Call s36-1 ran on an H200 in session 38 and measured k3 on the HF dir, but `k3 convert` and llama.cpp's build both
# failed at the same moment (the 22 GB HF dir + the 22 GB GGUF + the build on the 64 GiB disk: out of space, most
# likely; the logs were not kept). So: checkpoint -> GGUF -> the HF dir deleted, and both engines read the GGUF (k3
# read the GGUF and the HF dir at the same speed in s36-1 on the H100: 429.7 / 431.3 tok/s at batch 1). The free disk
# is printed at each step and the failing logs' tails are kept. llama.cpp 0c1e570 from .gpuwork/llama-cuda-slim.tar.xz,
# built with CUDA 90 in the background (16 jobs; ~450 s).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz .gpuwork/llama-cuda-slim.tar.xz; move
# models/k3-tiny/model.safetensors out of the tree for the call (64 MiB carry cap) and back after.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-588} - $(date +%s) + T0 )); }
O=$OUT; P=s38-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
disk() { echo "disk $1: $(df -BG --output=avail $BD | tail -1 | tr -d ' ') free $(el)"; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader; disk start
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz ) ; . scripts/perf/lib-gguf-slice.sh
LLAMA_JOBS=16 llama_cuda_bg llama-bench llama-batched-bench
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model
M=$BD/slice-k3; G=$M.gguf
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; echo "unpacked $(el)"
KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_k3_slice.py $M --layers 2 > /tmp/ckpt.log 2>&1
echo "ckpt rc=$? $(el)"; tail -1 /tmp/ckpt.log | cut -c1-160; disk ckpt
$B convert -m $M -o $G > /tmp/convert.log 2>&1; echo "gguf rc=$? $(el)"; tail -2 /tmp/convert.log | cut -c1-200; disk gguf
[ -f $G ] && rm -rf $M; disk "HF dir removed"
kb() { local name=$1 t=$2; shift 2
  timeout $t $B bench offline -m $G --device cuda --mem-bw -1 "$@" > $O/$P-k3-$name.txt 2>&1
  echo "k3 $name rc=$? $(el)"; grep -E "^\| .*(tg32|pp4096) .*[0-9] \|$" $O/$P-k3-$name.txt; }
kb tg 200 --kv-cache-dtype bf16 -p 0 -n 32 -d 512,8192 -b 1,8,64 -r 3
kb tg256 60 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 256 -r 3
kb pp 40 -p 4096 -n 0 -b 1 -r 2
kb pp-bf16 40 --gemm-precision bf16 -p 4096 -n 0 -b 1 -r 2
disk k3
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 90 ]; do sleep 2; done
cat /tmp/llama.done 2>/dev/null || echo "llama not built $(el)"; tail -4 /tmp/llama-build.log | cut -c1-200; cp /tmp/llama-build.log $O/$P-llama-build.log
LB=$BD/llama.cpp/b/bin
if [ -x $LB/llama-batched-bench ] && [ -f $G ]; then
  timeout 40 $LB/llama-bench -m $G -ngl 99 -fa 1 -p 4096 -n 0 -r 2 > $O/$P-llama-pp.txt 2>&1; echo "llama pp rc=$? $(el)"; grep -E "^\|" $O/$P-llama-pp.txt | grep -v -- "---"
  timeout $(( $(left) - 45 )) $LB/llama-batched-bench -m $G -ngl 99 -fa 1 -c 560000 -b 2048 -ub 512 -npp 512,8192 -ntg 32 -npl 1,8,64 > $O/$P-llama-batched.txt 2>&1
  echo "llama batched rc=$? $(el)"; grep -E "^\|" $O/$P-llama-batched.txt
  [ $(left) -gt 30 ] && { timeout $(( $(left) - 10 )) $LB/llama-batched-bench -m $G -ngl 99 -fa 1 -c 150000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 256 > $O/$P-llama-batched256.txt 2>&1; echo "llama 256 rc=$? $(el)"; grep -E "^\|" $O/$P-llama-batched256.txt; }
fi
. scripts/perf/lib-out.sh; out_bundle $P-k3-tg.txt $P-llama-batched.txt $P-k3-pp.txt $P-llama-pp.txt $P-k3-tg256.txt $P-llama-batched256.txt $P-k3-pp-bf16.txt
echo "done $(el)"
