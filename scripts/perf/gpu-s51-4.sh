#!/bin/bash
# Session 51 call 4 (written, NOT run: the device time ran out after 8 refused starts; ready for a later session): the K3-dims slice WITH its MLA layer (4 layers: K3's first full-attention layer is its fourth) on
# an 80 GB card, if it fits -- issue 18's "K3 slice decode batch 64 >= 50%" with the attention in it (s51-3 measured 3
# layers). bf16 MLA cache (the wgmma kernel's dtype) and the default. Carry: .gpuwork/k3bins.tar.xz.
BUDGET=200
. scripts/perf/lib-call.sh
kl_dummy_args  # BW: 3350 on an 80 GB card, 4175 (the measured copy rate) on an H200
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 --mem-bw $BW"
for d in 512 8192; do
  for ct in "" "--kv-cache-dtype bf16"; do
    [ $(left) -gt 50 ] || break
    timeout 70 $D/k3 bench offline $K3A $ct -p 0 -n 32 -d $d -b 1,64 -r 2 > /tmp/k3.txt 2>&1
    echo "k3 4L d$d ${ct:-default cache} rc=$? $(el)"; grep -E '^\| kimi|rror|out of memory' /tmp/k3.txt | head -4
  done
done | tee $OUT/k3-slice4.txt
echo "done $(el)"
