#!/bin/bash
# Session 62: the ring's wgmmas kept in flight through the barrier (wait<1> after the next chunk's are issued, five
# stages, descriptors by one add) against main 9b1dc59 (k3old), one call. Pack: scripts/gpu-pack-ab 9b1dc59.
# 1. CudaMoe.* (the ring vs the shared-memory form and the CPU; the MXFP8 tile form on the ring: 7228fd7, never run
# before); 2. racecheck + synccheck of the ring's small comparison and of the MXFP8 ring test; 3. timing (K3 QAT bank);
# 4. the K3-dims 4-layer pp4096 k3old / k3 alternating at bf16 / bf16x2 (two rounds) and mxfp8 (one); 5. ncu of gate+up;
# 6. the whole suite if time is left. Carry: .gpuwork (k3bins.tar.xz)
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 80 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:*Mxfp8MatchesCpuMxfp8*:-CudaMoe.*Timing' > "$OUT/moe-tests.log" 2>&1
echo "CudaMoe rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared|mxfp8 tiles" "$OUT/moe-tests.log" | head -24; xz -9 "$OUT/moe-tests.log"
for t in racecheck:CudaMoe.RingMatchesSharedFormSmall synccheck:CudaMoe.RingMatchesSharedFormSmall synccheck:CudaMoe.Mxfp8TilesMatchCpuMxfp8; do
  timeout 60 $CS --tool ${t%%:*} "$D/k3_cuda_tests" --gtest_filter="${t#*:}" > /tmp/cs.log 2>&1
  echo "$t rc=$? $(el) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done | tee "$OUT/sanitizers.txt"
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing.log" 2>&1
echo "timing rc=$? $(el)"; grep -E "timing.*(wg-|wgring|auto)" "$OUT/timing.log"
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 150 ] || break 2
  bench_arm "old $prec r$r" k3old "" $K3A --gemm-precision $prec
  bench_arm "new $prec r$r" k3 "" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
if [ "$(left)" -gt 120 ]; then
  bench_arm "old mxfp8" k3old "" $K3A --moe-activation-dtype mxfp8
  bench_arm "new mxfp8" k3 "" $K3A --moe-activation-dtype mxfp8
fi 2>&1 | tee "$OUT/ab-mxfp8.txt"
[ "$(left)" -gt 45 ] && K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout $(( $(left) - 8 )) ncu --kernel-name regex:expert_ring --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "expert_ring|Duration|Issue Slots|Eligible Warps|Pipe|stalled_(no_inst|barrier|wait|math)" "$OUT/ncu-ring.txt" | head -14
[ "$(left)" -gt 150 ] && cuda_suite
echo "done $(el)"
