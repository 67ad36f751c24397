#!/bin/bash
# Session 44 call 4: main after the session-42 bf16 GEMV was removed (linear.cu's warp-per-row kernel again; the rest of the
# batch-1 rework kept): the whole CUDA suite, then k3old (session 41's CUDA code) vs k3, alternating, Kimi-Linear-48B
# dummy (an H100: its first 12 layers) decode b1 x3, b8, b64, b256 x2; an ncu step split at b1. Carry
# .gpuwork/k3bins.tar.xz (k3 + k3_cuda_tests from main, k3old kept from scripts/gpu-pack-ab 3dad5ee).
set -u
mkdir -p /tmp/k3b; tar -xJf .gpuwork/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export K3_SHARED_DIR=/nonexistent; nvidia-smi --query-gpu=name --format=csv,noheader; ulimit -c 0
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1); LAY=""; BW=4175; [ "$MEM" -lt 100000 ] && LAY="--num-layers 12" && BW=3350
KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b $LAY"
timeout 240 /tmp/k3b/k3_cuda_tests > $OUT/suite.log 2>&1; echo "suite rc=$?"; grep -E "^\[  (FAILED|PASSED) " $OUT/suite.log | head; xz -9 $OUT/suite.log
for r in 1 2 3; do for v in old new; do BIN=/tmp/k3b/k3; [ $v = old ] && BIN=/tmp/k3b/k3old
  timeout 100 $BIN bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
for b in 8 64 256; do for v in old new old new; do BIN=/tmp/k3b/k3; [ $v = old ] && BIN=/tmp/k3b/k3old
  timeout 100 $BIN bench offline $KL -p 0 -n 32 -b $b -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b$b rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b8-256.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do
  timeout 110 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --log-file /tmp/ncu-n$n.csv /tmp/k3b/k3 bench offline $KL --enforce-eager -p 0 -n $n -b 1 -r 1 --mem-bw -1 > /tmp/ncu.out 2>&1
  echo "ncu n=$n rc=$?"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-n2.csv /tmp/ncu-n4.csv 4 > $OUT/ncu-b1-step.txt 2>&1; head -14 $OUT/ncu-b1-step.txt | cut -c1-150
