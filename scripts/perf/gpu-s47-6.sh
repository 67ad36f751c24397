#!/bin/bash
# Session 47 call 6 (issues 15 and 18): the whole CUDA suite with the int8-activation GEMV as the one-token rule for
# Q4_K / Q5_K / Q6_K (the test binary keeps the exact kernels via K3_QUANT_GEMV=exact; the q8 test forces q8); the
# projection chain (q8 arm for Q6_K too); the 26.5 GB Kimi-Linear-48B-dims GGUF at batch 1, the rule against
# K3_QUANT_GEMV=exact, two alternating rounds. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
# (The A/B loops rewritten with lib-k3-bins.sh's bin_ab / env_ab after the call: the same commands and labels.)
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
cuda_suite
timeout 60 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenProjections' 2>&1 | grep -E "us per projection" | tee $OUT/chain.txt
wait $QB; tail -1 /tmp/q48.log
env_ab 2 30 "gguf b1" q8 "" exact K3_QUANT_GEMV=exact -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
echo "done $(el)"
