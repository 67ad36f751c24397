#!/bin/bash
# Session 45 call 3: the route kernel's tree form (commit 28223c0) -- the MoE and whole-model CUDA tests (CudaMoe.Route*
# check the picks and weights against the rule on E 40 / 256 / 896 / 1000, K 1-32, NaN / inf / ties; CudaMoe.RouteTiming
# times it; the device time left allowed no whole suite), then k3old (7a36ac9: main without it) vs k3, Kimi-Linear-48B
# dummy b1 tg64, three alternating rounds.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 7a36ac9)
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
GW=$ROOT/.gpuwork; D=/tmp/k3b
. scripts/perf/lib-k3-bins.sh
k3bins_unpack
kl_dummy_args
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMoe.*:*CudaModel*:*CudaQuantModel*-CudaMoe.Timing' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |moe_route|memsets" $OUT/tests.log | head -14
for r in 1 2 3; do for v in old new; do BIN=$D/k3; [ $v = old ] && BIN=$D/k3old
  timeout 60 $BIN bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
echo "done $(el)"
