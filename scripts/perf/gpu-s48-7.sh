#!/bin/bash
# Session 48 call 7 (issues 15 / 18): the whole CUDA suite on the session's final code; the bf16 MoE GEMV's combine
# folded into the pair-major down kernel (K3_MOE_COMBINE=launch: its own launch), KL-48B dummy b1 alternating; on the
# host's CPU at 16 threads, the KDA decode kernels (kda_token.h) against the commit before them (k3old = 20e38e1,
# scripts/gpu-pack-ab) on the kl48 Q4_K_M GGUF; the q8 GEMV on 16-warp blocks for Q4_K / Q5_K groups of >= 2048 rows
# (K3_Q8_WARPS=8: 8 warps at every size) -- the kl48 GGUF b1 and the projection chain.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=${BUDGET:-440}
. scripts/perf/lib-call.sh
kl48_gguf_bg 10
cuda_suite
kl_dummy_args
env_ab 2 250 "kl b1" fold "" launch K3_MOE_COMBINE=launch $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee $OUT/ab-kl.txt
wait $QB; tail -1 /tmp/q48.log
ARM_TIMEOUT=60 bin_ab 2 140 "cpu t16" -m $G --device cpu --no-mmap -t 16 -p 0 -n 32 -b 1 -r 2 | tee $OUT/ab-cpu.txt
env_ab 2 30 "gguf b1" w16 "" w8 K3_Q8_WARPS=8 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
for w in 8 16; do [ $(left) -gt 25 ] || break
  E=""; [ $w = 8 ] && E="K3_Q8_WARPS=8"
  echo "warps $w"; env $E timeout 40 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenProjections' 2>&1 | grep -E " (q8|read) .*us per projection"
done | tee $OUT/chain.txt
echo "done $(el)"
