#!/bin/bash
# Session 58 call 3: the KDA prefill's elementwise kernels as a warp per (token tile | row, head) -- their tests, the
# pieces' timing (against s58-1's), pp4096 k3 (new) vs k3old (97a845d: the block-per-(row, head) kernels) alternating
# on the Kimi-Linear-dims slice at bf16 and bf16x2 and on the K3-dims slice at bf16, then the rest of the suite.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 97a845d)
BUDGET=${BUDGET:-420}
. scripts/perf/lib-call.sh
timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaKda.*:-*Timing*' 2>&1 | grep -E "conv\+l2|gates N|output gate|bf16 forms|^\[  (FAILED|PASSED)|Failure|Expected|actual" | tee "$OUT/kda-tests.txt"
timeout 90 "$D/k3_cuda_tests" --gtest_filter='CudaKdaPrefill.*' 2>&1 | grep -E "timing|FAILED|PASSED" | tee "$OUT/kda-prefill-pieces.txt"
echo "pieces done $(el)"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3"
K3S="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16"
{ bin_ab 2 200 kl-pp4096-bf16 $KLS --gemm-precision bf16
  bin_ab 2 150 kl-pp4096-bf16x2 $KLS
  ARM_TIMEOUT=90 bin_ab 1 120 k3-pp4096-bf16 $K3S; } 2>&1 | tee "$OUT/ab.txt"
timeout $(( $(left) - 10 )) "$D/k3_cuda_tests" --gtest_filter='-*Timing*:CudaMoe.*:CudaKda.*:CudaKdaPrefill.*' > "$OUT/suite.log" 2>&1
echo "rest of suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED  \]" "$OUT/suite.log" | head -20
xz -9 "$OUT/suite.log"
echo "done $(el)"
