#!/bin/bash
# Session 52 call 9 (issue 18 item 3): the MLA kernel's fine form with a non-blocking producer (up to 3 blocks in flight
# a warp) against the two-stage form: tests (both forms vs the CPU and each other), memcheck / synccheck on the fine
# form, the BF16 kernel timing (both forms per shape, one process). Carry: .gpuwork/k3bins.tar.xz.
BUDGET=300
. scripts/perf/lib-call.sh
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.*' > $OUT/mla-tests.log 2>&1
echo "mla tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|fine vs|fine 1 nh= 96" $OUT/mla-tests.log | head -20
CS=/usr/local/cuda/bin/compute-sanitizer
for tool in memcheck synccheck; do
  K3_MLA_WG_FINE=1 timeout 100 $CS --tool $tool $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > /tmp/cs.log 2>&1
  echo "$tool rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done | tee $OUT/sanitizers.txt
K3_MLA_TIMING_DTYPE=bfloat16 timeout 200 $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' > $OUT/mla-timing.log 2>&1
echo "timing rc=$? $(el)"; grep "timing" $OUT/mla-timing.log | sed -e 's/simt .*| wgmma  /| wgmma  /' | head -30
echo "done $(el)"
