#!/bin/bash
# Session 61: the ring's GLU epilogue as one loop (gate+up's machine code 39.4k -> 7.1k instructions) against main
# 82b0e9f (k3old: the unrolled epilogue), one call. Pack: k3 + k3_cuda_tests = the change, k3old = 82b0e9f's k3.
# 1. CudaMoe.* (the path table vs the CPU, the ring vs the shared-memory form); 2. racecheck + synccheck of the small
# comparison; 3. timing (K3 QAT bank); 4. the K3-dims 4-layer pp4096 k3old / k3 alternating at both precisions, three
# rounds, with the prefill roofline column; 5. ncu of gate+up (stall reasons); 6. the whole suite if time is left.
# Carry: .gpuwork/k3bins.tar.xz
BUDGET=${BUDGET:-480}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:-CudaMoe.*Timing' > "$OUT/moe-tests.log" 2>&1
echo "CudaMoe rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/moe-tests.log" | head -20; xz -9 "$OUT/moe-tests.log"
for tool in racecheck synccheck; do
  timeout 50 $CS --tool $tool "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
  echo "$tool rc=$? $(el) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done | tee "$OUT/sanitizers.txt"
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing.log" 2>&1
echo "timing rc=$? $(el)"; grep -E "timing.*(wg-|wgring)" "$OUT/timing.log"
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2 3; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 80 ] || break 2
  bench_arm "old $prec r$r" k3old "" $K3A --gemm-precision $prec
  bench_arm "new $prec r$r" k3 "" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
[ "$(left)" -gt 45 ] && K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout $(( $(left) - 8 )) ncu --kernel-name regex:expert_ring --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "expert_ring|Duration|Issue Slots|Eligible Warps|stalled_(no_inst|barrier|wait|math)" "$OUT/ncu-ring.txt" | head -12
[ "$(left)" -gt 150 ] && cuda_suite
echo "done $(el)"
