#!/bin/bash
# session 40 call 1 (issue 18): (a) the steep-gate 32- vs 40-token prefill discrepancy, every row printed, and the
# same models without routed layers (all dense): is it a routing near-tie flip? (b) where a prefill step's time goes
# now (K3_CUDA_PROFILE=1, pp4096, the Kimi-Linear-dims and K3-dims 4-layer dummies, default precision, and the K3
# slice with the register-A MoE form); (c) MoE decode kernel timing at n = 1..64 on both shapes, a fresh baseline.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-570} - $(date +%s) + T0 )); }
O=$OUT; P=s40-1; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
ulimit -c 0
export K3_SHARED_DIR=/nonexistent
timeout 150 stdbuf -oL $T --gtest_filter='CudaModelDummy.KdaOnly*' > $O/$P-steep.log 2>&1
echo "steep rc=$? $(el)"; grep -E "e2e|OK|FAILED" $O/$P-steep.log | cut -c1-200
for pre in kimi-linear-48b-a3b kimi-k3; do
  K3_CUDA_PROFILE=1 timeout 60 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --mem-bw -1 > $O/$P-prof-$pre.txt 2>&1
  echo "prof $pre rc=$? $(el)"; sed -n '/cuda profile/,/^|/p' $O/$P-prof-$pre.txt | head -14
done
K3_MOE_WGMMA=rs K3_CUDA_PROFILE=1 timeout 60 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --mem-bw -1 > $O/$P-prof-kimi-k3-rs.txt 2>&1
echo "prof k3 rs rc=$? $(el)"; grep -E "moe experts|linear|pp4096" $O/$P-prof-kimi-k3-rs.txt
for pre in kimi-linear-48b-a3b kimi-k3; do
  timeout 60 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > $O/$P-pp-$pre.txt 2>&1
  echo "pp graphed $pre rc=$? $(grep -E 'pp4096' $O/$P-pp-$pre.txt | head -1)"
done
K3_MOE_TIMING_SHAPES=qat,kl K3_MOE_TIMING_N=1,2,4,8,16,64 timeout $(( $(left) - 20 )) stdbuf -oL $T --gtest_filter=CudaMoe.Timing > $O/$P-timing.log 2>&1
echo "timing rc=$? $(el)"; grep -vE "^\[ (RUN|      OK) " $O/$P-timing.log | grep -E "n=|GB/s|auto" | head -60 | cut -c1-170
echo "done $(el)"
