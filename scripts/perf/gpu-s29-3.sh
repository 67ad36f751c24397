#!/bin/bash
# session 29 call 3 (issue 18 / 15): the tensor-core block GEMV's ring depth D (2, 3, 4 units of weights in registers
# per warp) and warps per tile KW (8, 4, 2), stand-alone (scripts/perf/qmma_bench.cu, built on the dev machine with
# -DK3_QMMA_DEPTH=D, carried as .gpuwork/s29/qmma.tar.xz), then ncu of the head and a K3-width matrix.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s29-3; mkdir -p /tmp/q && tar -xJf .gpuwork/s29/qmma.tar.xz -C /tmp/q
{
for D in 2 3 4; do
  b=/tmp/q/qmma_d$D
  for kw in 2 4 8; do for n in 1 8; do $b q6_k 163840 2304 $n 1 1 $kw 5 | sed "s/^/D$D /"; done; done
  for kw in 4 8; do for n in 1 8; do $b q4_k 4096 7168 $n 1 1 $kw | sed "s/^/D$D /"; $b q6_k 4096 7168 $n 1 1 $kw | sed "s/^/D$D /"; done; done
  $b q4_k 4096 7168 32 2 1 8 | sed "s/^/D$D /"; $b q4_k 4096 7168 64 1 1 8 | sed "s/^/D$D /"
  for kw in 4 8; do $b q4_k 4096 2304 8 1 1 $kw | sed "s/^/D$D /"; $b q5_k 4096 7168 8 1 1 $kw | sed "s/^/D$D /"; done
done
} > $O/$P-sweep.txt 2>&1; echo "sweep $(el)"; cat $O/$P-sweep.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || echo ncu)
S="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section LaunchStats"
timeout 120 $NCU $S --launch-skip 1 --launch-count 1 /tmp/q/qmma_d2 q6_k 163840 2304 8 1 1 8 2 > $O/$P-ncu-head-d2-kw8.txt 2>&1; echo "ncu1 $(el)"
timeout 120 $NCU $S --launch-skip 1 --launch-count 1 /tmp/q/qmma_d2 q4_k 4096 7168 8 1 1 8 2 > $O/$P-ncu-q4k-d2-kw8.txt 2>&1; echo "ncu2 $(el)"
grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|L1/TEX Hit|Mem Busy|Max Bandwidth|Theoretical Occ|Warp Cycles Per Issued" $O/$P-ncu-*.txt | cut -c1-160
echo "done $(el)"
