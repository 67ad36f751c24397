#!/bin/bash
# Session 53 call 3: the whole dummy Kimi-Linear-48B failed (rc=1) in s53-1 on the H200 -- its stderr, and the same
# with 20 layers if time is left (is it memory?), batch 1 / 64 / 256, depth 512 (trimmed to the session's last 250 s). Carry: .gpuwork/k3bins.tar.xz
BUDGET=100
. scripts/perf/lib-call.sh
kl_dummy_args
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
timeout 80 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 16 -d 512 -b 1,64,256 -r 1 > $OUT/kl.txt 2>&1
echo "kl rc=$? $(el)"; grep -vE "^\s*$" $OUT/kl.txt | tail -15
[ $(left) -gt 60 ] && { timeout 60 $D/k3 bench offline $KL --num-layers 20 --mem-bw $BW -p 0 -n 32 -d 512 -b 1,64,256 -r 2 > $OUT/kl20.txt 2>&1
  echo "kl 20L rc=$? $(el)"; grep -vE "^\s*$" $OUT/kl20.txt | tail -8; }
echo "done $(el)"
