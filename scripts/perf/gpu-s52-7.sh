#!/bin/bash
# Session 52 call 7 (issue 15's GPU target, on an H100 -- the H200 that s52-1 wants was refused four times): the 26.5 GB
# Kimi-Linear-48B-dims GGUF (k3's Q4_K_M, MXFP4 routed experts) in k3 (today's code) against llama.cpp 0c1e570's CUDA
# llama-batched-bench -fa 1 on the same file, batch 1-16 at depth 512, two alternating rounds (s46-3's form, whose k3
# was session 46's). Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cuda-bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=400
. scripts/perf/lib-call.sh
LC=/tmp/llc; mkdir -p $LC && tar -xJf $GW/llama-cuda-bins.tar.xz -C $LC; echo "llama cuda rc=$? $(el)"
kl48_gguf_bg 16
wait $QB; tail -1 /tmp/q48.log
K3G="bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2"
for r in 1 2; do [ $(left) -gt 60 ] || break
  timeout 80 $D/k3 $K3G > /tmp/k.txt 2>&1; echo "k3 r$r rc=$? $(el)"; grep -E "^\| kl48" /tmp/k.txt
  timeout 100 $LC/llama-batched-bench -m $G -ngl 99 -fa 1 -c 16384 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,2,4,8,16 > /tmp/l.txt 2>&1
  echo "llama r$r rc=$? $(el)"; grep -E "^\||error|failed" /tmp/l.txt | tail -8
done 2>&1 | tee $OUT/gpu-kl48.txt
echo "done $(el)"
