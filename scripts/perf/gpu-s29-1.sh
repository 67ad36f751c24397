#!/bin/bash
# session 29 call 1 (issues 18 / 15): session 28's unrun KDA refactor (CudaKdaTc.*); the tensor-core block GEMV for
# GGUF K-quants (quant_gemv_mma.cu): its tests, the block-kernel suites with it on the decode path, compute-sanitizer
# memcheck, and its timing against the fp32 block GEMV / bf16 tiles (CudaQuantMma.TimingAtK3Width).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins) or, without it, .gpuwork/deps.tar.xz (built here).
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${P:-s29-1}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
if [ -f .gpuwork/k3bins.tar.xz ]; then
  mkdir -p /tmp/k3b && tar -xJf .gpuwork/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH=/tmp/k3b; T=/tmp/k3b/k3_cuda_tests
else
  OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build
  export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu; T=build/cuda/k3_cuda_tests
fi
echo "binaries $(el)"; [ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
run() {  # name timeout filter [env...]
  local n=$1 t=$2 f=$3; shift 3
  env "$@" timeout $t $T --gtest_filter="$f" > $O/$P-$n.log 2>&1; echo "$n rc=$? $(el)"
  grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-$n.log | head -12
}
run kdatc 120 'CudaKdaTc.*'
run quant 240 'CudaQuantMma.*:CudaQuantKernels.*:-*Timing*'
grep -E "Failure|Expected|Which is|ratio|mt=" $O/$P-quant.log | head -30
run mma-timing 200 'CudaQuantMma.Timing*'
grep -E "quant mma" $O/$P-mma-timing.log
run models 200 'CudaQuantModel.*:CudaQuantMoe.*'
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.RefusesWhatItCannotRun:CudaQuantMma.PrepSums*:CudaQuantKernels.GemvAndPrefill*' \
  > $O/$P-memcheck.log 2>&1; echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -5
echo "done $(el)"
