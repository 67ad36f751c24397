#!/bin/bash
# Session 61 (after eight refused starts, in place of gpu-s61-1): one call to keep one ring form and try a deeper ring.
# The pack (made by hand like scripts/gpu-pack-ab): k3 + k3_cuda_tests = branch ring-v2-only (6fce514: session 60's
# second form as the only ring form, its ring 5 stages deep with split / 8 without; K3_MOE_RING_STAGES=4 = the 4-stage
# ring, PTX-identical to main's K3_MOE_RING_V2=1 kernels), k3old = main a68fd7c (ring v1 Auto's default).
# 1. the CUDA suite without timing tests (deep ring as Auto's); 2. racecheck + synccheck of RingMatchesSharedFormSmall,
# deep and 4-stage; 3. timing deep vs 4-stage (K3 QAT bank); 4. the K3-dims 4-layer pp4096 v1 (k3old) / v2 4-stage / v2
# deep alternating at both precisions with the prefill roofline column; 5. ncu of the deep gate+up with stall reasons.
# Carry: .gpuwork/k3bins.tar.xz
BUDGET=${BUDGET:-570}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 130 "$D/k3_cuda_tests" --gtest_filter='-*Timing*' > "$OUT/suite.log" 2>&1
echo "suite -*Timing* (v2 deep ring as Auto's) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/suite.log" | head -20
grep -c "^\[       OK" "$OUT/suite.log"; xz -9 "$OUT/suite.log"
for st in 0 4; do for tool in racecheck synccheck; do
  [ "$(left)" -gt 400 ] || break 2
  K3_MOE_RING_STAGES=$st timeout 60 $CS --tool $tool "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
  echo "stages=$st $tool rc=$? $(el) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done; done | tee "$OUT/sanitizers.txt"
for st in 0 4; do
  K3_MOE_RING_STAGES=$st K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing-st$st.log" 2>&1
  echo "timing stages=$st rc=$? $(el)"; grep -E "timing.*(wg-|wgring)" "$OUT/timing-st$st.log"
done
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 100 ] || break 2
  bench_arm "v1 $prec r$r" k3old "" $K3A --gemm-precision $prec
  bench_arm "v2-4st $prec r$r" k3 "K3_MOE_RING_STAGES=4" $K3A --gemm-precision $prec
  bench_arm "v2-deep $prec r$r" k3 "" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
[ "$(left)" -gt 50 ] && K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout $(( $(left) - 8 )) ncu --kernel-name regex:expert_ring --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "expert_ring|Duration|Issue Slots|Eligible Warps|ALU|Tensor|stalled" "$OUT/ncu-ring.txt" | head -60
echo "done $(el)"
