#!/bin/bash
# session 25 call 1 (issue 18 item 1): where the KDA tensor-core prefill's two kernels spend their time at the K3
# shape (1 x 8192 x 96, bf16 in, chunk 32): ncu full sections + per-SASS-line stall samples of kda_tc_state_kernel
# and kda_tc_intra2_kernel; per-kernel times beside fla chunk_kda (bc3b101d, carried as source).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s25
mkdir -p /tmp/fla && tar -xJf $GW/fla-src.tar.xz -C /tmp/fla
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
    scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1
echo "shim build rc=$? $(el)"; tail -3 /tmp/kdabuild.log
PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout 200 python3 scripts/bench_kda_tc.py /tmp/libkdashim.so --profile > $O/s25-1-kda-profile.log 2>&1
echo "profile rc=$? $(el)"; grep -E "==|ms/call" $O/s25-1-kda-profile.log | head -60
for kern in state intra2; do
  timeout 120 ncu --kernel-name regex:kda_tc_$kern --launch-skip 1 --launch-count 1 --set full --import-source yes \
    -o $O/s25-1-ncu-$kern python3 scripts/perf/kda_ncu_one.py /tmp/libkdashim.so 1 8192 96 32 0 0 2 > /tmp/ncu-$kern.log 2>&1
  echo "ncu $kern rc=$? $(el)"; tail -2 /tmp/ncu-$kern.log
  ncu --import $O/s25-1-ncu-$kern.ncu-rep --page details --print-units base 2>/dev/null > $O/s25-1-ncu-$kern.txt
  grep -E 'kda_tc|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|L2 Hit|L1/TEX Hit|Executed Ipc|Shared Memory Configuration|Block Limit|Pipe' $O/s25-1-ncu-$kern.txt | head -50
  ncu --import $O/s25-1-ncu-$kern.ncu-rep --page source --csv --print-source sass 2>/dev/null > $O/s25-1-ncu-src-$kern.csv
  echo "src lines $(wc -l < $O/s25-1-ncu-src-$kern.csv)"
done
xz -9 $O/*.csv 2>/dev/null; rm -f $O/*.ncu-rep
echo "done $(el)"
