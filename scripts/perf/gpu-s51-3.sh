#!/bin/bash
# Session 51 call 3: today's figures for issue 18's end-to-end decode targets on one card (the table in cuda.md had no
# row for "K3 slice decode batch 64 >= 50%" and a session-48 figure for Kimi-Linear batch 1): the K3-dims dummy slice
# (4 layers; 3 where 4 do not fit) at batch 1 / 8 / 64 / 256, depth 512 and 8192, and the Kimi-Linear-48B dummy (12
# layers on an 80 GB card) at batch 1 / 64 / 256, each with the bench's bandwidth roofline column (--mem-bw: the card's
# nominal HBM rate). Carry: .gpuwork/k3bins.tar.xz.
BUDGET=400
. scripts/perf/lib-call.sh
kl_dummy_args
NL=4; [ "$BW" = 3350 ] && NL=3
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers $NL --mem-bw $BW"
for d in 512 8192; do
  timeout 150 $D/k3 bench offline $K3A -p 0 -n 32 -d $d -b 1,8,64,256 -r 2 > /tmp/k3.txt 2>&1
  echo "k3 ${NL}L d$d rc=$? $(el)"; grep -E '^\|' /tmp/k3.txt
done | tee $OUT/k3-slice.txt
timeout 150 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 512 -b 1,64,256 -r 2 > /tmp/kl.txt 2>&1
echo "kl rc=$? $(el)"; grep -E '^\|' /tmp/kl.txt | tee $OUT/kl.txt
echo "done $(el)"
