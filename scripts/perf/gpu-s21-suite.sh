#!/bin/bash
# session 21 call 5 (final code): the whole CUDA suite; the quant GEMV timing with V1Rows at 8 tokens of tall matrices
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork
mkdir -p /tmp/k3b && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T=/tmp/k3b/k3_cuda_tests
$T --gtest_filter='-*Timing*:TpNccl.*' > $O/s21-5-suite.log 2>&1; echo "suite rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED|SKIPPED)|tests from .* ran|v1 rows" $O/s21-5-suite.log | head -12
$T --gtest_filter='CudaQuantKernels.GemvTimingAtK3Width' > $O/s21-5-gemv-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -E "163840|Q6_K    4096" $O/s21-5-gemv-timing.log
xz -9 $O/s21-5-suite.log
echo "done $(el)"
