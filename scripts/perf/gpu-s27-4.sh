#!/bin/bash
# session 27 call 4 (issue 18 item 1): the fused KDA kernel's variant 5 with fla beside it in ONE process at the K3
# shape (the issue's same-call figure; call s27-kda-2's bench timed out before fla), its unrun test
# (CudaKdaTc.FusedFastVariantsMatchRecurrence), and the CUDA model suites on this tree (the graph's new
# Backend::mla_absorbed default and the CPU's fused decode passes: CUDA must be unchanged).
# Carry: .gpuwork/s25k/fla-src.tar.xz, .gpuwork/deps.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-320} - $(date +%s) + T0 )); }
O=$OUT; P=s27-4; L=/tmp/libkdashim.so
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
( OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS=k3_cuda_tests . scripts/gpu-build; echo "build done $(el)" > /tmp/build.done ) &
mkdir -p /tmp/fla /tmp/so && tar -xJf .gpuwork/s25k/fla-src.tar.xz -C /tmp/fla
for f in scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu \
         src/k3/backend/cuda/kda_tc_state2.cu src/k3/backend/cuda/kda_tc_fused.cu; do
  nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Xcompiler -fPIC -Isrc \
    -c $f -o /tmp/so/$(basename $f).o > /tmp/so/$(basename $f).log 2>&1 &
done
wait $(jobs -p | tail -5) 2>/dev/null; sleep 1
while [ $(ls /tmp/so/*.o 2>/dev/null | wc -l) -lt 5 ] && [ $(left) -gt 200 ]; do sleep 1; done
nvcc -shared /tmp/so/*.o -o $L > /tmp/so/link.log 2>&1; echo "shim rc=$? $(el)"
R="default bf16-in (two kernels),fused ftz-exp T-consumer bf16-in,fused nbuf2 bf16-in,safe_gate"
KDA_BENCH_SHAPES=1x8192x96 KDA_BENCH_ONLY="$R" PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout 150 \
  python3 scripts/bench_kda_tc.py $L > $O/$P-kda-bench.log 2>&1; echo "bench rc=$? $(el)"
grep -E "GPU| ms " $O/$P-kda-bench.log | cut -c1-150
while [ ! -f /tmp/build.done ] && [ $(left) -gt 40 ]; do sleep 2; done; cat /tmp/build.done 2>/dev/null; tail -2 /tmp/build.log
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
T=build/cuda/k3_cuda_tests
if [ -x $T ]; then
  timeout $(( $(left) - 3 )) $T --gtest_filter='CudaKdaTc.*:*CudaModelE2E*:CudaModelDummy.*:Tiny*' > $O/$P-cuda-tests.log 2>&1
  echo "tests rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |tests ran|fused' $O/$P-cuda-tests.log | head -24
else
  tail -30 /tmp/build.log > $O/$P-build-tail.log
fi
echo "done $(el)"
