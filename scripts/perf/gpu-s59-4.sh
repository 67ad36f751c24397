#!/bin/bash
# Session 59 call 4: linear_group converting x once at prefill sizes: CudaLinearGroup.* (PrefillSizesEqualOneByOne new),
# the model tests; the Kimi-Linear-dims slice's profile at bf16 and bf16x2; pp4096 k3 vs k3old (506383f) alternating on
# the 4-layer slice (bf16, bf16x2) and the 12-layer KL48 (bf16).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 506383f)
BUDGET=${BUDGET:-420}
. scripts/perf/lib-call.sh
timeout 150 "$D/k3_cuda_tests" --gtest_filter='CudaLinearGroup.*:CudaModelDummy.*:*Bf16GemmTensorCoreKda*:*CudaModelE2E*:-*Timing*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|Failure" "$OUT/tests.log" | head -20
xz -9 "$OUT/tests.log"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3"
for g in bf16 bf16x2; do
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 60 "$D/k3" bench offline $KLS --gemm-precision $g > /tmp/p.txt 2>&1
  echo "profile $g rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi" /tmp/p.txt
done | tee "$OUT/kl-prof.txt"
kl_dummy_args
{ bin_ab 2 200 kl-4L-pp4096-bf16 $KLS --gemm-precision bf16
  bin_ab 2 150 kl-4L-pp4096-bf16x2 $KLS
  ARM_TIMEOUT=60 bin_ab 2 40 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
