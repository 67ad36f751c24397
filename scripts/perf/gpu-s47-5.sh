#!/bin/bash
# Session 47 call 5 (issues 15 and 18): one token of Q4_K / Q5_K on int8 activations (quant_gemv_q8.cu, K3_QUANT_GEMV=q8).
# The quant-kernel, pdl and GGUF-model tests (the q8 kernel against the CPU int8 tier, bit for bit, among them), the
# GGUF model tests again with K3_QUANT_GEMV=q8 (the GPU's logits against the CPU's default tier on the same file); the
# one-token projection chain (gemv / q8 / mma / read); the 26.5 GB Kimi-Linear-48B-dims GGUF at batch 1, the default
# against K3_QUANT_GEMV=q8, two alternating rounds. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
# (The A/B loops rewritten with lib-k3-bins.sh's bin_ab / env_ab after the call: the same commands and labels.)
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaQuantKernels.*:CudaPdl.*:*CudaQuantModel*:-*Timing*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|differ|Failure" $OUT/tests.log | head -20; xz -9 $OUT/tests.log
K3_QUANT_GEMV=q8 timeout 100 $D/k3_cuda_tests --gtest_filter='*CudaQuantModel*' > $OUT/tests-q8-model.log 2>&1
echo "q8 model tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|rel|argmax" $OUT/tests-q8-model.log | head -20; xz -9 $OUT/tests-q8-model.log
timeout 90 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenProjections' 2>&1 | grep -E "us per projection|pdl" | tee $OUT/chain.txt
wait $QB; tail -1 /tmp/q48.log
env_ab 2 40 "gguf b1" v3 "" q8 K3_QUANT_GEMV=q8 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
echo "done $(el)"
