#!/bin/bash
# Ready for session 61's first call (written in session 60, not yet run): the ring form's sanitizers on the small
# comparison test (v1, the default, and v2), v1 / v2 timing on the K3 QAT bank in one call, the K3-dims 4-layer pp4096
# smem / ring v1 / ring v2 alternating at both precisions, and ncu of v2 at n = 4096 -- to keep one ring form.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
for v in 0 1; do for tool in racecheck synccheck; do
  K3_MOE_RING_V2=$v timeout 100 $CS --tool $tool "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
  echo "v2=$v $tool rc=$? $(el) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done; done | tee "$OUT/sanitizers.txt"
for v in 0 1; do
  K3_MOE_RING_V2=$v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 100 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing-v2-$v.log" 2>&1
  echo "timing v2=$v rc=$? $(el)"; grep -E "timing.*(wg-|wgring)" "$OUT/timing-v2-$v.log"
done
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2; do for prec in bf16x2 bf16; do
  [ "$(left)" -gt 120 ] || break 2
  bench_arm "smem $prec r$r" k3 "K3_MOE_WGMMA=smem" $K3A --gemm-precision $prec
  bench_arm "ring1 $prec r$r" k3 "" $K3A --gemm-precision $prec
  bench_arm "ring2 $prec r$r" k3 "K3_MOE_RING_V2=1" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
[ "$(left)" -gt 60 ] && K3_MOE_RING_V2=1 K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout $(( $(left) - 10 )) ncu --kernel-name regex:expert_ring2 --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring2.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "expert_ring2|Duration|Issue Slots|Eligible Warps|ALU|Tensor|stalled" "$OUT/ncu-ring2.txt" | head -60
echo "done $(el)"
