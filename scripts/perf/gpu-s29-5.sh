#!/bin/bash
# session 29 call 5 (issues 15 / 18): the final tree -- quant_moe_choice's Mma rule (1..12 pairs per expert), the
# tensor-core expert tiles tested at both precisions -- on the H200: the quantised suites with their timings, a
# memcheck of the expert paths, then the whole CUDA test binary outside the timing tests. Carry: .gpuwork/deps.tar.xz
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s29-5
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3_cuda_tests" . scripts/gpu-build; echo "built $(el)"
T=build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
timeout 100 $T --gtest_filter='CudaQuant*:CudaMoe.*' > $O/$P-quant.log 2>&1; echo "quant rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran' $O/$P-quant.log | head; grep -E "quant moe timing" $O/$P-quant.log | sed 's/.*KL Q4_K.Q6_K//' | cut -c1-120
grep -E "quant moe grouped" $O/$P-quant.log | head -24
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 $CS --tool memcheck $T --gtest_filter='CudaQuantMoe.GroupedPath*:CudaQuantMma.RefusesWhatItCannotRun' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -3
timeout 200 $T --gtest_filter='-*Timing*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -12; xz -9 $O/$P-all.log
echo "done $(el)"
