#!/bin/bash
# session 27, KDA call 1 (issue 18 item 1): the fused KDA prefill kernel (src/k3/backend/cuda/kda_tc_fused.cu, one
# warp-specialised block per (sequence, head): 8 producer warps do the intra-chunk work of chunk c + 1 into a shared
# ring while 8 consumer warps advance the state over chunk c). Shim build (+ ptxas report), correctness against the
# fp32 recurrence and BITWISE against intra v3cs + state v2 (scripts/check_kda_tc.py --fused-only, varlen, bf16 and
# fp32-fallback), compute-sanitizer memcheck + racecheck on the small varlen case, the one-process bench at
# 1x8192x96, 8x1024x96, 1x8192x32 (fused, the default two-kernel path, fla chunk_kda safe_gate beside it), the
# producer / consumer alone (K3_KDA_TC_FUSED_SKIP, timing only), ncu of one fused launch at the K3 shape.
# Carry: .gpuwork/s25k/fla-src.tar.xz (fla bc3b101d / 0.5.2 source).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-380} - $(date +%s) + T0 )); }
O=$OUT; P=s27-kda-1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
mkdir -p /tmp/fla && tar -xJf .gpuwork/s25k/fla-src.tar.xz -C /tmp/fla
nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
  -Xptxas -v scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu \
  src/k3/backend/cuda/kda_tc_state2.cu src/k3/backend/cuda/kda_tc_fused.cu -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1
echo "shim rc=$? $(el)"; grep -A2 "fused_kernel" /tmp/kdabuild.log | grep -E "registers|spill" | head -4
L=/tmp/libkdashim.so
PYTHONUNBUFFERED=1 timeout 150 python3 scripts/check_kda_tc.py $L --fused-only > $O/$P-check.log 2>&1; echo "check rc=$? $(el)"
cut -c1-220 $O/$P-check.log | grep -E "fused|FAIL|ALL OK|error" | head -30
for tool in memcheck racecheck; do
  PYTHONUNBUFFERED=1 timeout 75 compute-sanitizer --tool $tool python3 scripts/check_kda_tc.py $L --fused-only --small \
    > /tmp/san-$tool.log 2>&1; echo "$tool rc=$? $(el)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|ALL OK|FAILURES|Hazard" /tmp/san-$tool.log | head -5
  { echo "== compute-sanitizer --tool $tool"; grep -vE "^\s*$" /tmp/san-$tool.log | tail -60; } >> $O/$P-sanitizer.log
done
KDA_BENCH_SHAPES=1x8192x96,8x1024x96,1x8192x32 KDA_BENCH_ONLY="default bf16-in (two kernels),fused,safe_gate" \
  PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout 150 python3 scripts/bench_kda_tc.py $L > $O/$P-bench.log 2>&1
echo "bench rc=$? $(el)"; grep -E "GPU| ms " $O/$P-bench.log | cut -c1-150
for sk in consumer producer; do
  echo "== K3_KDA_TC_FUSED_SKIP=$sk (timing only: the $sk idles, outputs wrong)" >> $O/$P-bench.log
  K3_KDA_TC_FUSED_SKIP=$sk KDA_BENCH_SHAPES=1x8192x96,1x8192x32 KDA_BENCH_ONLY="fused nbuf2 bf16-in" PYTHONUNBUFFERED=1 \
    timeout 40 python3 scripts/bench_kda_tc.py $L 2>&1 | grep -E " ms " >> $O/$P-bench.log
done
echo "skip rc=$? $(el)"; grep -A6 "FUSED_SKIP" $O/$P-bench.log | cut -c1-150
K3_KDA_TC_FUSED=1 timeout $(( $(left) - 15 )) ncu --clock-control none --kernel-name regex:'kda_tc_fused' --launch-skip 1 --launch-count 1 \
  --set full --import-source yes -o /tmp/$P-ncu python3 scripts/perf/kda_ncu_one.py $L 1 8192 96 32 0 0 2 > /tmp/ncu.log 2>&1
echo "ncu rc=$? $(el)"; tail -2 /tmp/ncu.log
ncu --import /tmp/$P-ncu.ncu-rep --page details --print-units base > $O/$P-ncu.txt 2>/dev/null
grep -E 'kda_tc|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Ipc|Issue Slots Busy|L1/TEX Hit|Shared Memory' $O/$P-ncu.txt | head -24
ncu --import /tmp/$P-ncu.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null && xz -9 -c /tmp/src.csv > $O/$P-ncu-src.csv.xz
grep -E "fused_kernel|registers|spill|error" /tmp/kdabuild.log > $O/$P-ptxas.txt
echo "done $(el)"
