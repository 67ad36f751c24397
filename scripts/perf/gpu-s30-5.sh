#!/bin/bash
# session 30 call 5: the whole CUDA test binary outside the timing tests on the session's final kernels (the Rows form
# and its rule). Carry: .gpuwork/deps.tar.xz
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s30-5
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3_cuda_tests" . scripts/gpu-build; echo "built $(el)"
T=build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
timeout 150 $T --gtest_filter='-*Timing*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -12; xz -9 $O/$P-all.log
