#!/bin/bash
# Session 52 call 7 (issue 15's GPU target, on an H100 -- the H200 that s52-1 wants was refused four times): the 26.5 GB
# Kimi-Linear-48B-dims GGUF (k3's Q4_K_M, MXFP4 routed experts) in k3 (today's code) against llama.cpp 0c1e570's CUDA
# llama-batched-bench -fa 1 on the same file, batch 1-16 at depth 512, two alternating rounds (s46-3's form, whose k3
# was session 46's). Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cuda-bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=400
. scripts/perf/lib-call.sh
kl48_vs_llama_cuda
echo "done $(el)"
