#!/bin/bash
# session 28 call 1: (a) issue 15's "larger model you can make here": k3-small (python/k3tiny/k3small_config.json,
# ~72M parameters, every matrix width whole 256-blocks, KDA heads 128 wide as K3's) trained with k3-tiny's trainer,
# kept in out/k3small on the machine for call 2 (the quality table); (b) issue 18: the KDA refactors of session 27
# on the GPU (CudaKdaTc.*), the fused kernel against the two-kernel path over shapes (its dispatch rule), and the
# CUDA model suites with the fused kernel forced on (K3_KDA_TC_FUSED=5).
# Carry: .gpuwork/deps.tar.xz .gpuwork/s28 (k3tiny-data.tar.xz).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-585} - $(date +%s) + T0 )); }
O=$OUT; P=s28-1; L=/tmp/libkdashim.so
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
( OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build
  echo "build done $(el)" > /tmp/build.done ) &
mkdir -p /tmp/data && tar -xJf .gpuwork/s28/k3tiny-data.tar.xz -C /tmp/data
PYTHONUNBUFFERED=1 python3 python/k3tiny/train.py --data /tmp/data --out out/k3small --config python/k3tiny/k3small_config.json \
  --minutes 5 --lr 2e-3 --warmup 100 --tokenizer models/k3-tiny > $O/$P-train.log 2>&1
echo "train rc=$? $(el)"; grep -E "params|tok/s" $O/$P-train.log | head -3; tail -4 $O/$P-train.log
cp out/k3small/log.jsonl $O/$P-train-log.jsonl 2>/dev/null; cp out/k3small/loss.png $O/$P-loss.png 2>/dev/null
du -sh out/k3small/hf out/k3small/hf-bf16 2>/dev/null; rm -f out/k3small/final.pt
# the KDA bench shim (compiles while the build finishes)
mkdir -p /tmp/so
for f in scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu \
         src/k3/backend/cuda/kda_tc_state2.cu src/k3/backend/cuda/kda_tc_fused.cu; do
  nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Xcompiler -fPIC -Isrc \
    -c $f -o /tmp/so/$(basename $f).o > /tmp/so/$(basename $f).log 2>&1 &
done
while [ ! -f /tmp/build.done ] && [ $(left) -gt 200 ]; do sleep 2; done; cat /tmp/build.done 2>/dev/null; tail -2 /tmp/build.log
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
T=build/cuda/k3_cuda_tests
if [ -x $T ]; then
  timeout 120 $T --gtest_filter='CudaKdaTc.*' > $O/$P-kdatc-tests.log 2>&1
  echo "kdatc tests rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |tests ran' $O/$P-kdatc-tests.log | head -12
else
  tail -30 /tmp/build.log > $O/$P-build-tail.log
fi
while [ $(ls /tmp/so/*.o 2>/dev/null | wc -l) -lt 5 ] && [ $(left) -gt 150 ]; do sleep 1; done
nvcc -shared /tmp/so/*.o -o $L > /tmp/so/link.log 2>&1; echo "shim rc=$? $(el)"
R="default bf16-in (two kernels),fused ftz-exp T-consumer bf16-in,fused nbuf2 bf16-in"
S=1x8192x96,1x8192x64,1x8192x48,1x8192x32,1x8192x16,2x4096x48,4x2048x32,8x1024x32,8x1024x96,1x2048x96,1x1024x96,16x512x96
KDA_BENCH_SHAPES=$S KDA_BENCH_ONLY="$R" PYTHONUNBUFFERED=1 timeout $(( $(left) - 100 )) \
  python3 scripts/bench_kda_tc.py $L > $O/$P-kda-sweep.log 2>&1; echo "sweep rc=$? $(el)"
grep -E "GPU| ms " $O/$P-kda-sweep.log | cut -c1-150
if [ -x $T ]; then
  K3_KDA_TC_FUSED=5 timeout $(( $(left) - 5 )) $T --gtest_filter='*CudaModelE2E*:CudaModelDummy.*:Tiny*:CudaKda*' \
    > $O/$P-fused-suites.log 2>&1
  echo "suites (fused 5) rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |tests ran' $O/$P-fused-suites.log | head -12
fi
echo "done $(el)"
