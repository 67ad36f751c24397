#!/bin/bash
# session 23 call 3 (issue 18): end-to-end prefill with the KDA intra kernel v1 vs v2 (K3_KDA_TC_INTRA), alternating,
# --gemm-precision bf16 (the mode that takes the tensor-core KDA): dummy Kimi-Linear-48B (all 27 layers) and the dummy
# K3 4-layer slice (96 KDA heads), pp4096; then Kimi-Linear-48B decode b1 / b256 for the roofline table.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork
mkdir -p /tmp/k3b && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=/tmp/k3b/k3
for r in 1 2; do for v in v1 v2; do
  for m in "kimi-linear-48b-a3b" "kimi-k3 --num-layers 4"; do
    K3_KDA_TC_INTRA=$v timeout 120 $B bench offline --device cuda --load-format dummy --preset $m --gemm-precision bf16 -p 4096 -n 0 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
    echo "$v r$r $m rc=$? $(el)"; grep -E "^\| .*pp4096" /tmp/pp.txt | head -2 | sed "s/^/$v r$r /" | tee -a $O/s23-3-pp.txt
  done; done; done
timeout 150 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 0 -n 32 -b 1,256 -r 2 --mem-bw 4175 > $O/s23-3-kl-tg.txt 2>&1
echo "kl tg rc=$? $(el)"; grep -E "^\| " $O/s23-3-kl-tg.txt | head -8
echo "done $(el)"
