#!/bin/bash
# Session 59 call 5 (and 6: the merged-row form, same script): CUTLASS experts at Bf16x2 in one grouped launch per GEMM stage
# adjacent): CudaMoe.* (CutlassSplitFormsGiveTheSameBits, CombineKernelsBitwise with splits) and the model tests;
# ncu of one KL MoE layer's kernels at bf16x2; the slice's bf16x2 profile; pp4096 k3 vs k3old (0b01852) alternating
# (4-layer slice bf16x2 and bf16; 12-layer KL48 bf16x2).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 0b01852)
BUDGET=${BUDGET:-480}
. scripts/perf/lib-call.sh
timeout 170 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:CudaModelDummy.*:*CudaModelE2E*:-*Timing*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|Failure|one launch vs two" "$OUT/tests.log" | head -30
xz -9 "$OUT/tests.log"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 1"
timeout 120 ncu --csv --kernel-name regex:"gather|fill_groups|glu_rows|combine|device_kernel" --launch-count 16 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed "$D/k3" bench offline $KLS 2>/dev/null | grep -E "gpu__time|dram__" | awk -F'","' '{n=$5; sub(/\(.*/,"",n); print substr(n,1,60), $(NF-2), $NF}' | tee "$OUT/ncu.txt"
echo "ncu done $(el)"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3"
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 60 "$D/k3" bench offline $KLS > /tmp/p.txt 2>&1
echo "profile bf16x2 rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi" /tmp/p.txt | tee "$OUT/kl-prof.txt"
kl_dummy_args
{ bin_ab 2 220 kl-4L-pp4096-bf16x2 $KLS
  bin_ab 1 180 kl-4L-pp4096-bf16 $KLS --gemm-precision bf16
  ARM_TIMEOUT=70 bin_ab 2 40 kl48-pp4096-bf16x2 $KL -p 4096 -n 0 -b 1 -r 2; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
