#!/bin/bash
# session 27, KDA call 2 (issue 18 item 1): the fused KDA prefill kernel after call 1's profile (the producer warps'
# chain was ~85% of the kernel): two full input stages (one producer barrier fewer, the next chunk's loads issued a
# whole chunk ahead), q / k / v read from the stage without the bf16 round trip, the sub-chunk exponentials in the
# ftz form (bit-identical for g > -5.45). Variants (KdaTcTuning::fused): 2 / 3 = two / three ring buffers
# (bit-identical to intra v3cs + state v2), 4 = every exponential ftz, 5 = 4 with T applied by the consumer warps.
# Shim build, scripts/check_kda_tc.py --fused-only (bitwise for 2 / 3, tolerance for 4 / 5), memcheck on the small
# varlen case, the one-process bench at 1x8192x96, 8x1024x96 (fla chunk_kda safe_gate beside it) and 1x8192x32, the
# producer / consumer alone (K3_KDA_TC_FUSED_SKIP), ncu of one launch of variant 2, the CudaKdaTc gtests (incl.
# FusedBitwiseEqualsSequential) built on the device.
# Carry: .gpuwork/s25k/fla-src.tar.xz (fla bc3b101d / 0.5.2 source), .gpuwork/deps.tar.xz (the test build's deps).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-385} - $(date +%s) + T0 )); }
O=$OUT; P=s27-kda-2; L=/tmp/libkdashim.so
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
mkdir -p /tmp/fla /tmp/so && tar -xJf .gpuwork/s25k/fla-src.tar.xz -C /tmp/fla
for f in scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu \
         src/k3/backend/cuda/kda_tc_state2.cu src/k3/backend/cuda/kda_tc_fused.cu; do
  nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Xcompiler -fPIC -Isrc \
    -Xptxas -v -c $f -o /tmp/so/$(basename $f).o > /tmp/so/$(basename $f).log 2>&1 &
done
wait; nvcc -shared /tmp/so/*.o -o $L > /tmp/so/link.log 2>&1; echo "shim rc=$? $(el)"
grep -E "fused_kernel|registers|spill|error" /tmp/so/kda_tc_fused.cu.log > $O/$P-ptxas.txt; grep -E "registers|spill" $O/$P-ptxas.txt
( OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS=k3_cuda_tests . scripts/gpu-build; echo "build done $(el)" > /tmp/build.done ) &
PYTHONUNBUFFERED=1 timeout 100 python3 scripts/check_kda_tc.py $L --fused-only > $O/$P-check.log 2>&1; echo "check rc=$? $(el)"
cut -c1-200 $O/$P-check.log | grep -E "fused|FAIL|ALL OK|error" | head -34
PYTHONUNBUFFERED=1 timeout 60 compute-sanitizer --tool memcheck python3 scripts/check_kda_tc.py $L --fused-only --small \
  > /tmp/san.log 2>&1; echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|ALL OK|FAILURES" /tmp/san.log | head -3
{ echo "== compute-sanitizer --tool memcheck"; grep -vE "^\s*$" /tmp/san.log | tail -40; } > $O/$P-sanitizer.log
R="default bf16-in (two kernels),fused,safe_gate"
KDA_BENCH_SHAPES=1x8192x96,8x1024x96 KDA_BENCH_ONLY="$R" PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout 130 \
  python3 scripts/bench_kda_tc.py $L > $O/$P-bench.log 2>&1; echo "bench rc=$? $(el)"
KDA_BENCH_SHAPES=1x8192x32 KDA_BENCH_ONLY="default bf16-in (two kernels),fused" PYTHONUNBUFFERED=1 timeout 40 \
  python3 scripts/bench_kda_tc.py $L 2>&1 | grep -E " ms " >> $O/$P-bench.log; echo "bench 32 rc=$? $(el)"
grep -E "GPU| ms " $O/$P-bench.log | cut -c1-150
for sk in consumer producer; do
  echo "== K3_KDA_TC_FUSED_SKIP=$sk (timing only: the $sk idles, outputs wrong)" >> $O/$P-bench.log
  K3_KDA_TC_FUSED_SKIP=$sk KDA_BENCH_SHAPES=1x8192x96 KDA_BENCH_ONLY="fused nbuf2 bf16-in,fused ftz-exp" PYTHONUNBUFFERED=1 \
    timeout 30 python3 scripts/bench_kda_tc.py $L 2>&1 | grep -E " ms " | grep -v chunk >> $O/$P-bench.log
done
echo "skip rc=$? $(el)"; grep -A4 "FUSED_SKIP" $O/$P-bench.log | cut -c1-150
K3_KDA_TC_FUSED=2 timeout 40 ncu --clock-control none --kernel-name regex:'kda_tc_fused' --launch-skip 1 --launch-count 1 \
  --set full --import-source yes -o /tmp/$P-ncu python3 scripts/perf/kda_ncu_one.py $L 1 8192 96 32 0 0 2 > /tmp/ncu.log 2>&1
echo "ncu rc=$? $(el)"; tail -1 /tmp/ncu.log
ncu --import /tmp/$P-ncu.ncu-rep --page details --print-units base > $O/$P-ncu.txt 2>/dev/null
grep -E 'Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued' $O/$P-ncu.txt | head -8
ncu --import /tmp/$P-ncu.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null && xz -9 -c /tmp/src.csv > $O/$P-ncu-src.csv.xz
while [ ! -f /tmp/build.done ] && [ $(left) -gt 50 ]; do sleep 2; done; cat /tmp/build.done 2>/dev/null; tail -2 /tmp/build.log
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
T=build/cuda/k3_cuda_tests
if [ -x $T ]; then
  timeout $(( $(left) - 3 )) $T --gtest_filter='CudaKdaTc.*' > $O/$P-cuda-tests.log 2>&1; echo "CudaKdaTc rc=$? $(el)"
  grep -E '^\[  (FAILED|PASSED|  OK) |fused vs' $O/$P-cuda-tests.log | head -24
else
  tail -30 /tmp/build.log > $O/$P-build-tail.log
fi
echo "done $(el)"
