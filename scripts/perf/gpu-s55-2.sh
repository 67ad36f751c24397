#!/bin/bash
# Session 55 call 2: the W4A8 engine path's test with its new tolerance, and CudaMoe.Timing's same-call A/B of the w4a8
# row against the decode kernels (K3 QAT shape, n = 1 / 8 / 64). Carry: .gpuwork/k3bins.tar.xz (k3, k3_cuda_tests).
BUDGET=${BUDGET:-300}
. scripts/perf/lib-call.sh
timeout 90 $D/k3_cuda_tests --gtest_filter='CudaMoe.W4a8MatchesCpuMxfp8' > $OUT/w4a8-tests.log 2>&1
echo "w4a8 test rc=$? $(el)"; grep -E "^\[ w4a8 \]|FAILED|PASSED|Failure" $OUT/w4a8-tests.log | head -20
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMoe.Timing' > $OUT/moe-timing.log 2>&1
echo "moe timing rc=$? $(el)"; grep -E "auto|w4a8|ring " $OUT/moe-timing.log | head -20
