#!/bin/bash
# session 26 call 1. CPU (issue 14): what one decode-sized projection and the routed-expert layer cost at 16
# threads on the H200 host's Xeon (KernelBench.DISABLED_DecodeOpLatency / DISABLED_MoeDecodeLayer), on the idle
# host before any build. GPU (issue 18 item 1): the KDA intra kernel v3 (persistent, next item prefetched;
# branch wip/kda-intra-v3) -- correctness on varlen batches + bitwise against v2 (scripts/check_kda_tc.py), the
# CudaKdaTc gtests (incl. IntraV3BitwiseEqualsV2, StateV2MatchesRecurrenceAndV1) and compute-sanitizer on the
# two new kernels' tests, the one-process bench against fla chunk_kda (bc3b101d), ncu of state2 + intra3.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-570} - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/s26
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'
mkdir -p /opt/k3deps && tar -xJf .gpuwork/deps.tar.xz -C /opt/k3deps &&
  sed -i "s|^prefix=.*|prefix=/opt/k3deps/usr|" /opt/k3deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
xz -dc $GW/k3_tests.xz > /tmp/k3_tests && chmod +x /tmp/k3_tests
{ for isa in amx avx512bf16; do echo "== K3_CPU_ISA=$isa, 16 threads"
    K3_CPU_ISA=$isa K3_NUM_THREADS=16 /tmp/k3_tests --gtest_also_run_disabled_tests --gtest_filter=KernelBench.DISABLED_DecodeOpLatency | grep -v '^\['
  done
  for e in 512 64; do echo "== MoeDecodeLayer E=$e avx512bf16 16 threads"
    K3_MOE_BENCH_EXPERTS=$e K3_CPU_ISA=avx512bf16 K3_NUM_THREADS=16 /tmp/k3_tests --gtest_also_run_disabled_tests --gtest_filter=KernelBench.DISABLED_MoeDecodeLayer | grep -v '^\['
  done; } > $O/s26-1-cpu-ops.txt 2>&1
echo "cpu benches $(el)"; cat $O/s26-1-cpu-ops.txt
# the CUDA test binary in the background (no grammar / MPI: the kernel tests need neither)
( OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS=k3_cuda_tests . scripts/gpu-build; echo "build done $(el)" > /tmp/build.done ) &
mkdir -p /tmp/fla && tar -xJf $GW/fla-src.tar.xz -C /tmp/fla
nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
  scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu src/k3/backend/cuda/kda_tc_state2.cu \
  -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1; echo "shim rc=$? $(el)"; tail -3 /tmp/kdabuild.log
PYTHONUNBUFFERED=1 timeout 120 python3 scripts/check_kda_tc.py /tmp/libkdashim.so > $O/s26-1-kda-check.log 2>&1; echo "check rc=$? $(el)"
cut -c1-200 $O/s26-1-kda-check.log
while [ ! -f /tmp/build.done ] && [ $(left) -gt 200 ]; do sleep 2; done; cat /tmp/build.done 2>/dev/null; tail -3 /tmp/build.log
T=build/cuda/k3_cuda_tests
if [ -x $T ]; then
  timeout 90 $T --gtest_filter='CudaKdaTc.*' > $O/s26-1-cuda-tests.log 2>&1; echo "CudaKdaTc rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED|  OK) ' $O/s26-1-cuda-tests.log | head -20
  timeout 120 compute-sanitizer --tool memcheck $T --gtest_filter='CudaKdaTc.IntraV3BitwiseEqualsV2:CudaKdaTc.StateV2MatchesRecurrenceAndV1' \
    >> $O/s26-1-cuda-tests.log 2>&1; echo "memcheck rc=$? $(el)"; grep -E 'ERROR SUMMARY|PASSED|FAILED' $O/s26-1-cuda-tests.log | tail -4
fi
KDA_BENCH_SHAPES=1x8192x96,8x1024x96,1x8192x32 KDA_BENCH_ONLY="bv32 buf1 bf16-in intra2,state-v2 8w bf16-in intra,state-v2 4w bf16-in intra,safe_gate" \
  PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout $(( $(left) - 75 )) python3 scripts/bench_kda_tc.py /tmp/libkdashim.so > $O/s26-1-kda-bench.log 2>&1
echo "bench rc=$? $(el)"; grep -E "GPU| ms " $O/s26-1-kda-bench.log | cut -c1-150
timeout $(( $(left) - 5 )) ncu --kernel-name regex:'kda_tc_(state2|intra3)' --launch-skip 2 --launch-count 2 --set full --import-source yes \
  -o /tmp/s26-ncu python3 scripts/perf/kda_ncu_one.py /tmp/libkdashim.so 1 8192 96 32 0 4 2 > /tmp/ncu.log 2>&1
echo "ncu rc=$? $(el)"; tail -2 /tmp/ncu.log
ncu --import /tmp/s26-ncu.ncu-rep --page details --print-units base > $O/s26-1-ncu.txt 2>/dev/null
grep -E 'kda_tc|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Ipc|L2 Hit|Block Limit Reg|Block Limit Shared' $O/s26-1-ncu.txt | head -40
ncu --import /tmp/s26-ncu.ncu-rep --page source --csv --print-source sass > /tmp/s26-1-ncu-src.csv 2>/dev/null && xz -9 -c /tmp/s26-1-ncu-src.csv > $O/s26-1-ncu-src.csv.xz
echo "done $(el)"
