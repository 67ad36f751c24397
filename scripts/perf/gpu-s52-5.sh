#!/bin/bash
# Session 52 call 5 (issue 18 item 2): why the FP8 form of the MXFP4 decode kernels lost to the ring kernel in s52-4
# (0.86-0.95x, with ~35% fewer instructions a chunk counted) -- ncu of one gate/up launch of each inside the K3-dims
# dummy slice's decode step at batch 8 (speed of light, compute / memory workload, warp states, occupancy), and the
# FP8 kernel's per-SASS-line stall samples (csv). Carry: .gpuwork/k3bins.tar.xz (models/k3-tiny's tokenizer in the tree).
BUDGET=400
. scripts/perf/lib-call.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
kl_dummy_args
NL=4; [ "$BW" = 3350 ] && NL=3
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers $NL -p 0 -n 3 -d 512 -b 8 -r 1"
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy"
K3_MOE_DEC_VARIANT=ring timeout 150 $NCU --kernel-name regex:"dec_ring_kernel" --launch-skip 4 --launch-count 1 $SEC --print-units base \
    $D/k3 bench offline $K3A > $OUT/ncu-ring-b8.txt 2>&1
echo "ncu ring rc=$? $(el)"
K3_MOE_DEC_VARIANT=fp8 timeout 150 $NCU --kernel-name regex:"matrix_kernel" --launch-skip 4 --launch-count 1 $SEC --print-units base \
    $D/k3 bench offline $K3A > $OUT/ncu-fp8-b8.txt 2>&1
echo "ncu fp8 rc=$? $(el)"
[ $(left) -gt 120 ] && K3_MOE_DEC_VARIANT=fp8 timeout 120 $NCU --kernel-name regex:"matrix_kernel" --launch-skip 4 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --print-units base --page source --csv $D/k3 bench offline $K3A > $OUT/ncu-src-fp8-b8.csv 2>/dev/null
echo "src rc=$? $(el)"; xz -9 $OUT/ncu-src-fp8-b8.csv
for f in ring fp8; do echo "== $f"; grep -E "Duration|DRAM Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|Achieved Active Warps|Registers Per|Eligible|L1/TEX Hit|Mem Pipes" $OUT/ncu-$f-b8.txt | head -14; done
echo "done $(el)"
