#!/bin/bash
# Session 58 call 5: the session's prefill changes together, k3 (HEAD) vs k3old (2d0737f, the session's start)
# alternating: the Kimi-Linear-48B dummy (its first 12 layers on an 80 GB card) pp4096 at bf16 and bf16x2, the K3-dims
# 4-layer slice at bf16. Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 2d0737f)
BUDGET=${BUDGET:-170}
. scripts/perf/lib-call.sh
kl_dummy_args
K3S="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16"
{ ARM_TIMEOUT=60 bin_ab 2 60 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16
  ARM_TIMEOUT=60 bin_ab 1 50 kl48-pp4096-bf16x2 $KL -p 4096 -n 0 -b 1 -r 2
  ARM_TIMEOUT=50 bin_ab 1 40 k3-4L-pp4096-bf16 $K3S; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
