#!/bin/bash
# Session 61's first call (written in session 60, reordered in 61 after six refused starts): keep one ring form.
# 1. the CUDA suite without its timing tests with ring v2 as Auto's MXFP4 prefill form (K3_MOE_RING_V2=1: its n80
#    step, the small comparison test and the review mends run for the first time); 2. racecheck + synccheck of
#    CudaMoe.RingMatchesSharedFormSmall for v2 and v1; 3. v1 / v2 timing on the K3 QAT bank; 4. the K3-dims 4-layer
#    pp4096 ring v1 / v2 alternating at both precisions (the shared-memory form once), with the prefill roofline
#    column; 5. ncu of v2 with its stall reasons.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-570}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
K3_MOE_RING_V2=1 timeout 130 "$D/k3_cuda_tests" --gtest_filter='-*Timing*' > "$OUT/suite-v2.log" 2>&1
echo "suite -*Timing* (ring v2 as Auto's) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/suite-v2.log" | head -20
grep -c "^\[       OK" "$OUT/suite-v2.log"; xz -9 "$OUT/suite-v2.log"
for v in 1 0; do for tool in racecheck synccheck; do
  [ "$(left)" -gt 380 ] || break 2
  K3_MOE_RING_V2=$v timeout 60 $CS --tool $tool "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
  echo "v2=$v $tool rc=$? $(el) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done; done | tee "$OUT/sanitizers.txt"
for v in 1 0; do
  K3_MOE_RING_V2=$v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing-v2-$v.log" 2>&1
  echo "timing v2=$v rc=$? $(el)"; grep -E "timing.*(wg-|wgring)" "$OUT/timing-v2-$v.log"
done
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 110 ] || break 2
  [ "$r" = 1 ] && bench_arm "smem $prec r$r" k3 "K3_MOE_WGMMA=smem" $K3A --gemm-precision $prec
  bench_arm "ring1 $prec r$r" k3 "" $K3A --gemm-precision $prec
  bench_arm "ring2 $prec r$r" k3 "K3_MOE_RING_V2=1" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
[ "$(left)" -gt 50 ] && K3_MOE_RING_V2=1 K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout $(( $(left) - 8 )) ncu --kernel-name regex:expert_ring2 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring2.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "expert_ring2|Duration|Issue Slots|Eligible Warps|ALU|Tensor|stalled" "$OUT/ncu-ring2.txt" | head -60
echo "done $(el)"
