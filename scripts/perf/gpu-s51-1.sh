#!/bin/bash
# Session 51 call 1: the MLA decode kernel's pair form (65..128 heads: the two head blocks of a token as a 2-CTA cluster,
# each row read from L2 once and sent to the peer over distributed shared memory). Its tests (the same bits as two
# separate blocks), compute-sanitizer memcheck / synccheck on them, the kernel timing (pair vs separate blocks in the
# same process), and the whole CUDA suite (also session 50's last, never GPU-run commit 7ed6ed6) -- with the pair form
# off (K3_MLA_PAIR=0) if its tests fail or hang. Carry: .gpuwork/k3bins.tar.xz.
BUDGET=585
. scripts/perf/lib-call.sh
timeout 60 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.*' > $OUT/mla-tests.log 2>&1
RC=$?; echo "mla tests rc=$RC $(el)"; grep -E "wgmma|pair|FAILED|PASSED" $OUT/mla-tests.log | head -30
if [ $RC -ne 0 ]; then
  export K3_MLA_PAIR=0
  echo "pair form off for the suite"
else
  for tool in memcheck synccheck; do
    timeout 100 compute-sanitizer --tool $tool $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > $OUT/san-$tool.log 2>&1
    echo "$tool rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/san-$tool.log | head -3
  done
  for shape in 96,8192,64 96,8192,256 96,32768,64 96,8192,8 96,8192,1 96,131072,1 32,8192,64; do
    K3_MLA_TIMING_DTYPE=bfloat16 K3_MLA_TIMING_ONLY=$shape timeout 40 $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' 2>&1 | grep timing | cut -c1-400
  done | tee $OUT/mla-timing.txt
  echo "timing done $(el)"
fi
[ $(left) -gt 200 ] && cuda_suite
echo "done $(el)"
