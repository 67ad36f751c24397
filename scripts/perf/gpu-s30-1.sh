#!/bin/bash
# session 30 call 1 (issues 15 / 18): verify session 29's unrun fix and suites on the H200.
# (1) compute-sanitizer memcheck of the dense tensor-core block GEMV after the sums' row-length fix (quant_mma_ldx),
#     scripts/perf/qmma_bench.cu built on the dev machine (.gpuwork/s29/qmma_fix.xz), exact-size buffers, 3..64 tokens;
# (2) build on the device; the model-level GGUF suites (Presets/CudaQuantModel.*: CPU vs CUDA logits on GGUFs);
# (3) the whole CUDA test binary outside the timing tests; (4) CudaQuantMma timing (this call's baseline).
# Carry: .gpuwork/deps.tar.xz .gpuwork/s29/qmma_fix.xz
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s30-1
xz -dc .gpuwork/s29/qmma_fix.xz > /tmp/qb && chmod +x /tmp/qb
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for f in q4_k q6_k; do for n in 3 9 17 24 33 40 56 64; do for mt in 1 2; do
  [ $mt = 2 ] && [ $n != 17 ] && [ $n != 40 ] && continue
  echo -n "$f n=$n mt=$mt: "
  timeout 30 $CS --tool memcheck --print-limit 3 /tmp/qb $f 70 2304 $n $mt 1 1 2>&1 | grep -E "ERROR SUMMARY|Invalid" | head -2 | tr '\n' ' '; echo
done; done; done > $O/$P-memcheck-qmma.txt 2>&1
cat $O/$P-memcheck-qmma.txt | cut -c1-120; echo "clean: $(grep -c 'ERROR SUMMARY: 0 errors' $O/$P-memcheck-qmma.txt) $(el)"
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3_cuda_tests" . scripts/gpu-build; echo "built $(el)"
T=build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
timeout 150 $T --gtest_filter='*CudaQuantModel*' > $O/$P-quantmodel.log 2>&1; echo "quantmodel rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|^\[       OK' $O/$P-quantmodel.log | head -30
timeout 60 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.WithinItsBound*:CudaQuantKernels.GemvAndPrefill*' > $O/$P-memcheck-tests.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck-tests.log | head -4
timeout 240 $T --gtest_filter='-*Timing*:*CudaQuantModel*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -12; xz -9 $O/$P-all.log
timeout 60 $T --gtest_filter='CudaQuantMma.Timing*' > $O/$P-qmma-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -iE "us|timing" $O/$P-qmma-timing.log | head -30
echo "done $(el)"
