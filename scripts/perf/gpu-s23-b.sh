#!/bin/bash
# session 23 call B (issue 18 item 1): the KDA tensor-core prefill with the new 8-warp intra kernel (v2): CudaKdaTc
# tests (v2 default, then v1 via K3_KDA_TC_INTRA), compute-sanitizer racecheck + memcheck on the new paths, the
# one-process bench against fla chunk_kda (carried as source: .gpuwork/fla-src.tar.xz), per-kernel profile.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-570} - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork
mkdir -p /tmp/k3b /tmp/fla && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && tar -xJf $GW/fla-src.tar.xz -C /tmp/fla
export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T=/tmp/k3b/k3_cuda_tests
( nice nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
    scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1 ) &
$T --gtest_filter='CudaKdaTc.*:*Bf16GemmBoundedGate*' > $O/s23-b-tests.log 2>&1; echo "kda tests (v2) rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|\[ *OK|err" $O/s23-b-tests.log | head -30
K3_KDA_TC_INTRA=v1 $T --gtest_filter='CudaKdaTc.*' > /tmp/v1.log 2>&1; echo "kda tests (v1 default) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED)|FAILED  \]" /tmp/v1.log | head
for tool in racecheck memcheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='CudaKdaTc.IntraVariants*:CudaKdaTc.ChunkStates*' > /tmp/san-$tool.log 2>&1
  echo "sanitizer $tool rc=$? $(el)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" /tmp/san-$tool.log | head -4 | tee -a $O/s23-b-sanitizer.txt
done
wait; tail -3 /tmp/kdabuild.log
PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout $(( $(left) - 100 )) python3 scripts/bench_kda_tc.py /tmp/libkdashim.so > $O/s23-b-kda-bench.log 2>&1; echo "kda bench rc=$? $(el)"
grep -E "GPU|intra|fla|chunked|FAILED" $O/s23-b-kda-bench.log | grep -E "bf16-in|fla|chunked32|GPU|FAILED" | head -80
PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout $(( $(left) - 5 )) python3 scripts/bench_kda_tc.py /tmp/libkdashim.so --profile > $O/s23-b-kda-profile.log 2>&1; echo "kda profile rc=$? $(el)"
tail -40 $O/s23-b-kda-profile.log
echo "done $(el)"
