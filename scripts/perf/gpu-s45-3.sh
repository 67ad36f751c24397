#!/bin/bash
# Session 45 call 3: the route kernel's tree form (branch s45-route) -- the whole CUDA suite (CudaMoe.Route* check the
# picks and weights against the rule on E 40 / 256 / 896 / 1000, K 1-32, NaN / inf / ties; CudaMoe.RouteTiming times
# it), then k3old (main) vs k3 (the branch), Kimi-Linear-48B dummy b1 tg64, three alternating rounds.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab main)
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
GW=$ROOT/.gpuwork; D=/tmp/k3b
. scripts/perf/lib-k3-bins.sh
k3bins_unpack
kl_dummy_args
cuda_suite
xz -dc $OUT/suite.log.xz | grep -E "moe_route|memsets|Route" | head -12
for r in 1 2 3; do for v in old new; do BIN=$D/k3; [ $v = old ] && BIN=$D/k3old
  timeout 60 $BIN bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
echo "done $(el)"
