#!/bin/bash
# Session 56 call 3: the least that says whether the GPU form of --moe-activation-dtype mxfp8 is right and what the
# W4A8 path gains (~2 minutes of device time were left): the new tests, the timing row, the prototype's n = 8 forms.
BUDGET=${BUDGET:-110}
. scripts/perf/lib-call.sh
F='CudaMxfp8.*:CudaMoe.W4a8MatchesCpuMxfp8:CudaMoe.Mxfp8TilesMatchCpuMxfp8:CudaModelE2E.Mxfp8MatchesCpuMxfp8:CudaMoe.TinyShapes'
moe_tests_and_timing 60 "$F"
[ "$(left)" -gt 15 ] && timeout $(( $(left) - 5 )) $GW/w4a8_bench time 8 3 > $OUT/w4a8-time.txt 2>&1
echo "w4a8 time rc=$? $(el)"; grep -E "^n=|splits=1:" $OUT/w4a8-time.txt
echo "done $(el)"
