#!/bin/bash
# Session 57 call 5: the MXFP8 model test with its prefill check re-derived from s57-4 (the leading row, the median row
# nearer the CPU's MXFP8 than its float32 logits), then the whole suite again.
# Carry: .gpuwork/k3bins.tar.xz
BUDGET=${BUDGET:-300}
. scripts/perf/lib-call.sh
timeout 60 "$D/k3_cuda_tests" --gtest_filter='*Mxfp8*' 2>&1 | grep -E "^\[ e2e|^\[  (FAILED|PASSED)|Failure|Expected|actual" | tee $OUT/mxfp8-tests.txt
timeout $(( $(left) - 10 )) "$D/k3_cuda_tests" --gtest_filter='-*Timing*' > "$OUT/suite.log" 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED  \]" "$OUT/suite.log" | head -20
xz -9 "$OUT/suite.log"
echo "done $(el)"
