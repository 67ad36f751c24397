#!/bin/bash
# Session 50 call 3: the final tree -- the seesaw kernel as the only wgmma MLA kernel, the nh >= 32 rule: its tests,
# the whole CUDA suite, the kernel timing at the two batch-64 / 8k shapes. Carry: .gpuwork/k3bins.tar.xz.
BUDGET=230
. scripts/perf/lib-call.sh
timeout 60 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.*' > $OUT/mla-tests.log 2>&1
echo "mla tests rc=$? $(el)"; grep -E "wgmma|FAILED|PASSED" $OUT/mla-tests.log | head -14
cuda_suite
for shape in 96,8192,64 32,8192,64 96,8192,1; do
  K3_MLA_TIMING_DTYPE=bfloat16 K3_MLA_TIMING_ONLY=$shape timeout 30 $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' 2>&1 | grep timing | cut -c1-330
done | tee $OUT/mla-timing.txt
echo "done $(el)"
