#!/bin/bash
# Session 63's first call (ran as s63-1). Pack: scripts/gpu-pack-bins at bedda08 (session 62's ring with its two opt-in
# variants, plus session 63's warp-specialised body; the env switches it sets are gone since bed7f19). One binary, env A/B:
# 1. CudaMoe.Ring* (RingVariantsMatchSharedForm runs K3_RING_GRID=col, K3_RING_WIDTHS=8, both, K3_RING_WS=1 and all
#    three) + the MXFP8 ring test, then that test again under K3_RING_WS=1 -- the variants' first run; synccheck of the
#    small ring test under col+widths and under ws; 2. timing of the K3 QAT bank at n = 2048 / 4096 per variant;
# 3. the K3-dims 4-layer pp4096 at bf16 and bf16x2, base / col / widths / ws alternating, two rounds; 4. ncu DRAM and
# stall reasons of gate+up under ws, then col; 5. the whole suite if time is left. Carry: .gpuwork
BUDGET=${BUDGET:-585}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 120 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Ring*:CudaMoe.Mxfp8TilesMatchCpuMxfp8' > "$OUT/ring-tests.log" 2>&1
echo "ring tests (RingVariantsMatchSharedForm: every variant) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/ring-tests.log" | head -40
K3_RING_WS=1 timeout 40 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Mxfp8TilesMatchCpuMxfp8' > "$OUT/mxfp8-ws.log" 2>&1
echo "mxfp8 under ws rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|wgring" "$OUT/mxfp8-ws.log" | head -8
for v in "K3_RING_GRID=col K3_RING_WIDTHS=8" "K3_RING_WS=1"; do
  env $v timeout 60 $CS --tool synccheck "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
  echo "synccheck [$v] rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done 2>&1 | tee "$OUT/sanitizers.txt"
for v in "" "K3_RING_GRID=col" "K3_RING_WIDTHS=8" "K3_RING_GRID=col K3_RING_WIDTHS=8" "K3_RING_WS=1" "K3_RING_WS=1 K3_RING_GRID=col"; do
  env $v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048,4096 timeout 50 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > /tmp/tm.log 2>&1
  echo "[$v] timing rc=$? $(el)"; grep -E "timing.*wgring" /tmp/tm.log
done 2>&1 | tee "$OUT/timing.txt"
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for r in 1 2; do for prec in bf16x2 bf16; do
  [ "$(left)" -gt 230 ] || break 2
  bench_arm "base $prec r$r" k3 "" $K3A --gemm-precision $prec
  bench_arm "ws $prec r$r" k3 "K3_RING_WS=1" $K3A --gemm-precision $prec
  bench_arm "col $prec r$r" k3 "K3_RING_GRID=col" $K3A --gemm-precision $prec
  bench_arm "widths $prec r$r" k3 "K3_RING_WIDTHS=8" $K3A --gemm-precision $prec
done; done 2>&1 | tee "$OUT/ab.txt"
for v in K3_RING_WS=1 K3_RING_GRID=col; do
  [ "$(left)" -gt 70 ] || break
  env $v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout 60 ncu --kernel-name regex:expert_ring \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring-${v%%=*}.txt" 2>&1
  echo "ncu [$v] rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Issue Slots|stalled_(barrier|long_sc|wait|math|sleep|branch)" "$OUT/ncu-ring-${v%%=*}.txt" | head -9
done
[ "$(left)" -gt 150 ] && cuda_suite
echo "done $(el)"
