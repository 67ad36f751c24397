#!/bin/bash
# Session 44 call 3: ncu step split (difference of the 4- and 2-token runs: 4 steps with the warm-up) of the batch-1 decode with the new bf16 GEMV
# (gemv_bf16.cu) and with K3_GEMV_V1=1 (the first kernel), per-launch CSVs kept, to see per matrix size why the new
# kernel lost in s44-1. Carry .gpuwork/k3bins.tar.xz.
set -u
mkdir -p /tmp/k3b; tar -xJf .gpuwork/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export K3_SHARED_DIR=/nonexistent; nvidia-smi --query-gpu=name --format=csv,noheader
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1); LAY=""; [ "$MEM" -lt 100000 ] && LAY="--num-layers 12"
KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b $LAY"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in new v1; do E=""; [ $v = v1 ] && E="K3_GEMV_V1=1"
  for n in 2 4; do
    env $E timeout 110 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
      --log-file /tmp/ncu-$v-n$n.csv /tmp/k3b/k3 bench offline $KL --enforce-eager -p 0 -n $n -b 1 -r 1 --mem-bw -1 > /tmp/ncu.out 2>&1
    echo "ncu $v n=$n rc=$?"
  done
  python3 scripts/perf/ncu_step_diff.py /tmp/ncu-$v-n2.csv /tmp/ncu-$v-n4.csv 4 > $OUT/ncu-$v-step.txt 2>&1
  head -8 $OUT/ncu-$v-step.txt | cut -c1-150
  grep -E "gemv" /tmp/ncu-$v-n4.csv | gzip -9 > $OUT/ncu-$v-n4-gemv.csv.gz
done
