#!/bin/bash
# Session 59 call 3: the MoE prefill glue (moe_combine's block-per-token kernel, the plan kernel's unrolled passes):
# CudaMoe.* (the new CombineKernelsBitwise included) and the model tests; ncu of one Kimi-Linear-dims MoE layer's kernels;
# pp4096 bf16 and bf16x2 k3 vs k3old (1605ebb: before these two) alternating on the 4-layer slice and the 12-layer KL48.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 1605ebb)
BUDGET=${BUDGET:-420}
. scripts/perf/lib-call.sh
timeout 150 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:CudaModelDummy.*:*Bf16GemmTensorCoreKda*:-*Timing*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|Failure" "$OUT/tests.log" | head -20
xz -9 "$OUT/tests.log"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --gemm-precision bf16"
timeout 120 ncu --csv --kernel-name regex:"plan_kernel|combine" --launch-count 8 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed "$D/k3" bench offline $KLS 2>/dev/null | grep -E "gpu__time|dram__" | awk -F'","' '{print $5, $(NF-2), $NF}' | tee "$OUT/ncu.txt"
echo "ncu done $(el)"
kl_dummy_args
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3"
{ bin_ab 2 200 kl-4L-pp4096-bf16 $KLS --gemm-precision bf16
  bin_ab 1 160 kl-4L-pp4096-bf16x2 $KLS
  ARM_TIMEOUT=60 bin_ab 2 40 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
