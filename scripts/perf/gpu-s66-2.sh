#!/bin/bash
# Session 66's short call (the budget left after refused starts): the MXFP4 x q8 dp4a prototype's check and timing at
# K3's expert shapes (n = 1 / 8 / 64) and the engine's decode rows at the same n in one process order -- the figures that
# decide whether the q8 decode path is built (docs/perf/cuda.md "Session 66"). Carry: .gpuwork (k3bins.tar.xz,
# mxfp4_q8_bench built by the nvcc line in its header).
BUDGET=${BUDGET:-200}
. scripts/perf/lib-call.sh
"$GW/mxfp4_q8_bench" selftest; timeout 40 "$GW/mxfp4_q8_bench" check 2>&1 | tee "$OUT/q8-check.txt"; echo "q8 check rc=$? $(el)"
for n in 1 8 64; do timeout 40 "$GW/mxfp4_q8_bench" time $n 20; echo "q8 time $n rc=$? $(el)"; done 2>&1 | tee "$OUT/q8-time.txt"
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout $(( $(left) > 70 ? $(left) - 10 : 60 )) "$D/k3_cuda_tests" \
  --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing-dec.log" 2>&1
echo "engine decode timing rc=$? $(el)"; grep -E "timing" "$OUT/moe-timing-dec.log" | grep -E "auto|w4a8|dec" | cut -c1-170 | head -30
echo "done $(el)"
