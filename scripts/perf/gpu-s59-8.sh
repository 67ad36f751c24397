#!/bin/bash
# Session 59 call 8: CUTLASS experts writing bf16 at --gemm-precision bf16: CudaMoe.* (cutlass-bf16 against the CPU,
# CombineKernelsBitwise with bf16 partials) and the model tests; ncu of one KL MoE layer at bf16; pp4096 bf16 k3 vs
# k3old (3300da9) alternating on the 4-layer slice and the 12-layer KL48.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 3300da9)
BUDGET=${BUDGET:-400}
. scripts/perf/lib-call.sh
timeout 170 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:CudaModelDummy.*:*Bf16GemmTensorCoreKda*:-*Timing*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|Failure|cutlass-bf16 " "$OUT/tests.log" | head -30
xz -9 "$OUT/tests.log"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --gemm-precision bf16"
timeout 100 ncu --csv --kernel-name regex:"gather|glu_rows|combine|device_kernel" --launch-count 10 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed "$D/k3" bench offline $KLS 2>/dev/null | grep -E "gpu__time|dram__" | awk -F'","' '{n=$5; sub(/\(.*/,"",n); print substr(n,1,60), $(NF-2), $NF}' | tee "$OUT/ncu.txt"
echo "ncu done $(el)"
kl_dummy_args
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --gemm-precision bf16"
{ bin_ab 3 120 kl-4L-pp4096-bf16 $KLS
  ARM_TIMEOUT=60 bin_ab 2 40 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
