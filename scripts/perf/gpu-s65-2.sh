#!/bin/bash
# Session 65's short call (the device budget left after refused starts): session 64's narrow-scale ring decode's test
# (its first run), the session-64 refactors' tests, the MXFP4 x q8 dp4a prototype (check; K3's expert shapes at
# n = 1 / 8 / 64) and the engine's decode rows at the same n. Carry: .gpuwork (k3bins.tar.xz, mxfp4_q8_bench)
BUDGET=${BUDGET:-230}
. scripts/perf/lib-call.sh
"$GW/mxfp4_q8_bench" selftest; timeout 60 "$GW/mxfp4_q8_bench" check 2>&1 | tee "$OUT/q8-check.txt"; echo "q8 check rc=$? $(el)"
for n in 1 8 64; do timeout 40 "$GW/mxfp4_q8_bench" time $n 20; echo "q8 time $n rc=$? $(el)"; done 2>&1 | tee "$OUT/q8-time.txt"
# Where the prototype's gate|up time goes at n = 8 (its first launch: tiles of one pair, the minb=1 variant).
[ "$(left)" -gt 90 ] && timeout 60 ncu --kernel-name regex:gateup_q8 --launch-count 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy "$GW/mxfp4_q8_bench" time 8 1 > "$OUT/q8-ncu.txt" 2>&1
echo "q8 ncu rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots|Warp Cycles Per Issued" "$OUT/q8-ncu.txt" | head -10
timeout 70 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.RingNarrow*:CudaMoe.RingMatchesSharedForm*' > "$OUT/tests.log" 2>&1
echo "narrow tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|narrow|ring vs shared" "$OUT/tests.log" | head -20
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout $(( $(left) > 100 ? 60 : 30 )) "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing-dec.log" 2>&1
echo "engine decode timing rc=$? $(el)"; grep -E "timing" "$OUT/moe-timing-dec.log" | grep -E "auto|w4a8|dec" | cut -c1-170 | head -30
[ "$(left)" -gt 25 ] && timeout $(( $(left) - 15 )) "$D/k3_cuda_tests" --gtest_filter='CudaQuantMoe.*:CudaMlaDecode.*' > "$OUT/refactor-tests.log" 2>&1
echo "refactor tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]" "$OUT/refactor-tests.log" | head
echo "done $(el)"
