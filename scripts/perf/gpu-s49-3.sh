#!/bin/bash
# Session 49 call 3 (issue 18): what holds the MXFP4 ring decode kernels at one token -- ncu's stall, scheduler,
# memory and occupancy sections for the gate/up and down launches of a kl48 GGUF batch-1 step (no depth: the bench's
# depth prefill would take the tile path) and of the K3-dims dummy; the GLU fold's rule (Kimi-Linear at one token
# only) A/B against K3_MOE_DEC_FOLD=0 on the GGUF b1 and the K3 dummy b1.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 3"
env_ab 2 420 "k3 b1" fold "" launches K3_MOE_DEC_FOLD=0 $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"
timeout 80 $NCU --kernel-name regex:"dec_ring" --launch-skip 20 --launch-count 2 $SECS $D/k3 bench offline $K3A -p 0 -n 2 -b 1 -r 1 > $OUT/ncu-k3-b1.txt 2>&1; echo "== ncu k3 rc=$? $(el)"
wait $QB; tail -1 /tmp/q48.log
GA="-m $G --device cuda --kv-cache-dtype bf16 -p 0"
env_ab 2 250 "gguf b1" fold "" launches K3_MOE_DEC_FOLD=0 $GA -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
[ $(left) -gt 90 ] && timeout 80 $NCU --kernel-name regex:"dec_ring" --launch-skip 20 --launch-count 2 $SECS $D/k3 bench offline $GA -n 2 -b 1 -r 1 > $OUT/ncu-gguf-b1.txt 2>&1; echo "== ncu gguf rc=$? $(el)"
for f in $OUT/ncu-*.txt; do echo "== $f"; grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth|One or More|Waves Per SM|Executed Ipc A" $f | cut -c1-110 | head -40; done
echo "done $(el)"
