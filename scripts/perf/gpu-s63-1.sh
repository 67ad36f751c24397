#!/bin/bash
# Ready for session 63's first call (written in session 62, not yet run). Pack: scripts/gpu-pack-bins at 047bf9d or later
# (session 62's ring with its two opt-in variants). One binary, env A/B:
# 1. CudaMoe.Ring* (RingVariantsMatchSharedForm runs K3_RING_GRID=col, K3_RING_WIDTHS=8 and both) + the MXFP8 ring
# test -- the variants' first run; synccheck of the small ring test under both; 2. timing of the K3 QAT bank at n = 2048 / 4096 per variant;
# 3. the K3-dims 4-layer pp4096 at bf16 and bf16x2, base / col / widths / both alternating, two rounds; 4. ncu DRAM and
# stall reasons of gate+up under col; 5. the whole suite if time is left. Carry: .gpuwork
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 90 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Ring*:CudaMoe.Mxfp8TilesMatchCpuMxfp8' > "$OUT/ring-tests.log" 2>&1
echo "ring tests (RingVariantsMatchSharedForm: every variant) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/ring-tests.log" | head -24
env K3_RING_GRID=col K3_RING_WIDTHS=8 timeout 60 $CS --tool synccheck "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
echo "synccheck col+widths rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')" | tee "$OUT/sanitizers.txt"
for v in "" "K3_RING_GRID=col" "K3_RING_WIDTHS=8" "K3_RING_GRID=col K3_RING_WIDTHS=8"; do
  env $v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048,4096 timeout 50 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > /tmp/tm.log 2>&1
  echo "[$v] timing rc=$? $(el)"; grep -E "timing.*wgring" /tmp/tm.log
done 2>&1 | tee "$OUT/timing.txt"
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 200 ] || break 2
  bench_arm "base $prec r$r" k3 "" $K3A --gemm-precision $prec
  bench_arm "col $prec r$r" k3 "K3_RING_GRID=col" $K3A --gemm-precision $prec
  bench_arm "widths $prec r$r" k3 "K3_RING_WIDTHS=8" $K3A --gemm-precision $prec
  bench_arm "both $prec r$r" k3 "K3_RING_GRID=col K3_RING_WIDTHS=8" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
[ "$(left)" -gt 60 ] && K3_RING_GRID=col K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout $(( $(left) - 8 )) ncu --kernel-name regex:expert_ring \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring-col.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Issue Slots|highest-utilized|stalled_(barrier|wait|math)" "$OUT/ncu-ring-col.txt" | head -8
[ "$(left)" -gt 150 ] && cuda_suite
echo "done $(el)"
