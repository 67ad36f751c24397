#!/bin/bash
# Session 44 call 2: session 42-2 A/B again with the whole tg lines printed (s42-2.sh's grep matched the disk table only):
# old (session 41 CUDA) vs new (the batch-1 rework), K3_GEMV_V1=1, K3_MOE_SHARED_FUSED=0 at b1; b256 old vs new. Carry .gpuwork/k3bins.tar.xz.
set -u
mkdir -p /tmp/k3b; tar -xJf .gpuwork/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export K3_SHARED_DIR=/nonexistent; nvidia-smi --query-gpu=name --format=csv,noheader
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1); LAY=""; BW=4175; [ "$MEM" -lt 100000 ] && LAY="--num-layers 12" && BW=3350
KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b $LAY"
/tmp/k3b/k3 bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > $OUT/first.txt 2>&1; tail -30 $OUT/first.txt
for r in 1 2 3; do for v in old new v1 nofuse; do
  case $v in old) BIN=/tmp/k3b/k3old; E="";; new) BIN=/tmp/k3b/k3; E="";; v1) BIN=/tmp/k3b/k3; E="K3_GEMV_V1=1";; nofuse) BIN=/tmp/k3b/k3; E="K3_MOE_SHARED_FUSED=0";; esac
  env $E timeout 100 $BIN bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1
  echo "$v r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
for v in old new old new; do BIN=/tmp/k3b/k3; [ $v = old ] && BIN=/tmp/k3b/k3old
  timeout 100 $BIN bench offline $KL -p 0 -n 32 -b 256 -r 1 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b256 rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done | tee $OUT/ab-b256.txt
for b in 8 64; do for v in old new old new; do BIN=/tmp/k3b/k3; [ $v = old ] && BIN=/tmp/k3b/k3old
  timeout 100 $BIN bench offline $KL -p 0 -n 64 -b $b -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b$b rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b8-64.txt
