#!/bin/bash
# Session 63's second call, after s63-1: the ring with the transposed grid and widths in steps of 16 as its only form
# (K3_RING_GRID / K3_RING_WIDTHS / K3_RING_WS gone), and the opt-in mbarrier-paced form (K3_RING_BARRIER=0, not yet run).
# 1. the ring and MXFP8 tests (RingMbarFormMatchesSharedForm: its first run), the model tests, synccheck under mbar;
# 2. timing of the K3 QAT bank at n = 2048 / 4096, default and mbar; 3. the K3-dims 4-layer pp4096 (default and mbar) / pp2048
# at bf16 and bf16x2 with the roofline column; 4. on an H200 the whole Kimi-Linear-48B dummy pp4096 at bf16 (its first measurement since s57); 5. ncu's per-instruction
# stall samples of gate+up; 6. the suite if time is left. Pack: scripts/gpu-pack-bins at bed7f19 or later. Carry: .gpuwork
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
timeout 120 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Ring*:CudaMoe.Mxfp8TilesMatchCpuMxfp8:*CudaModelE2E.*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/tests.log" | head -20
K3_RING_BARRIER=0 timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool synccheck "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingMatchesSharedFormSmall' > /tmp/cs.log 2>&1
echo "synccheck [mbar] rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')" | tee "$OUT/sanitizers.txt"
for v in "" "K3_RING_BARRIER=0"; do
  env $v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048,4096 timeout 50 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > /tmp/tm.log 2>&1
  echo "[$v] timing rc=$? $(el)"; grep -E "timing.*wgring" /tmp/tm.log
done 2>&1 | tee "$OUT/timing.txt"
kl_dummy_args
for p in 4096 2048; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 200 ] || break 2
  bench_arm "k3 4L pp$p $prec" k3 "" --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p $p -n 0 -b 1 -r 2 \
    --peak-tflops 989 --gemm-precision $prec
  [ "$p" = 4096 ] && bench_arm "k3 4L pp$p $prec mbar" k3 "K3_RING_BARRIER=0" --device cuda --load-format dummy --preset kimi-k3 \
    --num-layers 4 -p $p -n 0 -b 1 -r 2 --peak-tflops 989 --gemm-precision $prec
done; done 2>&1 | tee "$OUT/k3-peak.txt"
[ "$BW" = 4175 ] && [ "$(left)" -gt 130 ] && ARM_TIMEOUT=$(( $(left) - 20 )) bench_arm "kl48 bf16" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 \
  --peak-tflops 989 --gemm-precision bf16 2>&1 | tee "$OUT/kl-peak.txt"
# Where the col grid's gate+up stalls, instruction by instruction (PC sampling joined to the SASS; s63-1's aggregate
# stalls: barrier 1.09, wait 1.21, math-pipe throttle 0.96, MIO throttle 0.84 cycles an issue).
[ "$(left)" -gt 150 ] && { K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout 60 ncu --kernel-name regex:expert_ring --launch-count 1 \
  --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring-source.csv" 2>&1; echo "ncu source rc=$? $(el)"; xz -9 "$OUT/ncu-ring-source.csv"; }
[ "$(left)" -gt 110 ] && { timeout $(( $(left) - 10 )) "$D/k3_cuda_tests" > "$OUT/suite.log" 2>&1; echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) " "$OUT/suite.log" | head; xz -9 "$OUT/suite.log"; }
echo "done $(el)"
