#!/bin/bash
# session 28 call 6 (issue 18): the KDA shape rule's new test (CudaKdaTc.DefaultPicksTheFusedKernelByShape) and the
# whole CUDA test binary on this tree (the fused kernel now the default at sequences x heads >= 96; the imatrix /
# calibration changes do not touch CUDA). Carry: .gpuwork/deps.tar.xz.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3_cuda_tests" . scripts/gpu-build; echo "build $(el)"
T=build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $OUT/s28-6-build-tail.log; exit 1; }
timeout 120 $T --gtest_filter='CudaKdaTc.*' > $OUT/s28-6-kdatc.log 2>&1; echo "kdatc rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |default dispatch' $OUT/s28-6-kdatc.log | head -12
timeout 300 $T > $OUT/s28-6-all.log 2>&1; echo "all rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $OUT/s28-6-all.log | head -12
xz -9 $OUT/s28-6-all.log
