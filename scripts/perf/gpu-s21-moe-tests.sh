#!/bin/bash
# session 21 call 6: dec_kernel on the shared helpers (stage_acts, mx_chunk_any, store_partials): the MoE tests (vs the
# CPU reference, and ring / ring4 bitwise against it)
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
mkdir -p /tmp/k3b && tar -xJf .gpuwork/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
/tmp/k3b/k3_cuda_tests --gtest_filter='CudaMoe.*:Tiny/CudaModelE2E.*:-CudaMoe.Timing' > $OUT/s21-6-moe-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)" $OUT/s21-6-moe-tests.log; echo "bitwise 0-differ lines: $(grep -c ' 0 of ' $OUT/s21-6-moe-tests.log), other: $(grep 'floats differ' $OUT/s21-6-moe-tests.log | grep -vc ' 0 of ')"
