#!/bin/bash
# Session 59 call 7: the session together. The whole CUDA suite (200 s cap) on HEAD; pp4096 k3 (HEAD) vs k3old
# (f8c02e0, the session's start) alternating: the 12-layer Kimi-Linear-48B dummy at bf16 and bf16x2, the K3-dims
# 4-layer slice at bf16 and bf16x2.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab f8c02e0)
BUDGET=${BUDGET:-540}
. scripts/perf/lib-call.sh
cuda_suite
kl_dummy_args
K3S="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2"
{ ARM_TIMEOUT=60 bin_ab 2 200 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16
  ARM_TIMEOUT=70 bin_ab 2 140 kl48-pp4096-bf16x2 $KL -p 4096 -n 0 -b 1 -r 2
  ARM_TIMEOUT=50 bin_ab 1 90 k3-4L-pp4096-bf16 $K3S --gemm-precision bf16
  ARM_TIMEOUT=60 bin_ab 1 40 k3-4L-pp4096-bf16x2 $K3S; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
