#!/bin/bash
# Session 48 call 1 (issues 18 and 15): the new tests (h permuted for the bf16 MoE down kernel: same bits; the q8 rule at
# model level against the CPU's avx2int8 tier; the q8 kernels' bits with the early weight loads); the projection chain
# with the q8 kernel's weights loaded before x's quantisation (K3_Q8_EARLY=0: after, session 47's form); the
# Kimi-Linear-48B dummy (12 layers) b1 with K3_MOE_HPERM=0 / 1 (three alternating rounds) and b8; the kl48 Q4_K_M GGUF
# b1 with K3_Q8_EARLY=0 / 1; on the host's CPU, 16 threads, the same GGUF with K3_MLA_PREFETCH=0 / 1 (session 47's
# absorbed-MLA row prefetch, not yet measured at 16 threads). Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMoe.GemvHPerm*:CudaMoe.SharedExpert*:CudaMoe.KimiLinearShape:CudaQuantModelQ8.*:CudaQuantKernels.Q8*:CudaQuantModel*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |\[ q8 e2e|h perm kimi|Q8Gemv" $OUT/tests.log | head -30
for e in 0 1; do
  echo "K3_Q8_EARLY=$e"; K3_Q8_EARLY=$e timeout 60 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenProjections' 2>&1 | grep -E "us per projection"
done | tee $OUT/chain.txt
kl_dummy_args
env_ab 3 300 "kl b1" perm "" noperm K3_MOE_HPERM=0 $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee $OUT/ab-kl.txt
env_ab 1 280 "kl b8" perm "" noperm K3_MOE_HPERM=0 $KL -p 0 -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-kl.txt
wait $QB; tail -1 /tmp/q48.log
env_ab 2 150 "gguf b1" early "" late K3_Q8_EARLY=0 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
ARM_TIMEOUT=60 env_ab 3 70 "cpu t16" pf "" nopf K3_MLA_PREFETCH=0 -m $G --device cpu --no-mmap -t 16 -p 0 -n 32 -b 1 -r 2 | tee $OUT/ab-cpu.txt
echo "done $(el)"
