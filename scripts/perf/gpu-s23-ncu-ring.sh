#!/bin/bash
# session 23 call 1: what bounds the ring MXFP4 decode kernel (issue 18 item 2): ncu of dec_ring_kernel inside a
# dummy K3 4-layer slice decode step (eager, so each launch is profiled) at batch 1, 8, 64; per-kernel sections
# (speed of light, memory, warp states, scheduler, occupancy) and the source-level stall table of the hottest lines.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork
mkdir -p /tmp/k3b && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=/tmp/k3b/k3
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-200
for b in 1 8 64; do
  timeout 150 ncu --kernel-name regex:dec_ring --launch-skip 12 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --import-source no -o $O/s23-1-ncu-ring-b$b \
    $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 0 -n 4 -b $b -r 1 --enforce-eager > /tmp/ncu-b$b.log 2>&1; rc=$?; tail -3 /tmp/ncu-b$b.log
  echo "ncu b=$b rc=$rc $(el)"
  ncu --import $O/s23-1-ncu-ring-b$b.ncu-rep --page details --print-units base 2>/dev/null > $O/s23-1-ncu-ring-b$b.txt
  grep -E 'dec_ring|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|L2 Hit|L1/TEX Hit|Executed Ipc' $O/s23-1-ncu-ring-b$b.txt | head -60
done
for b in 1 64; do
  timeout 100 ncu --kernel-name regex:dec_ring --launch-skip 12 --launch-count 1 --section WarpStateStats --section SourceCounters \
    --print-units base --page source --csv \
    $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 0 -n 4 -b $b -r 1 --enforce-eager > $O/s23-1-ncu-src-b$b.csv 2>/dev/null
  echo "src b=$b rc=$? lines $(wc -l < $O/s23-1-ncu-src-b$b.csv) $(el)"
done
xz -9 $O/*.csv 2>/dev/null; rm -f $O/*.ncu-rep
echo "done $(el)"
