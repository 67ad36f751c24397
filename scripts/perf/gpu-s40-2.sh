#!/bin/bash
# session 40 call 2 (issue 18): where a prefill step's time goes without the warm-up pass (K3_CUDA_PROFILE_SKIP=1):
# pp4096 of the Kimi-Linear-dims and K3-dims 4-layer dummies; an 8-layer KL dummy's decode at batch 1 and 256 (profile; the whole model does not fit an H100).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s40-2; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
for pre in kimi-linear-48b-a3b kimi-k3; do
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 90 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-prof-pp-$pre.txt 2>&1
  echo "prof pp $pre rc=$? $(el)"; sed -n '/cuda profile/,/^| [a-z]/p' $O/$P-prof-pp-$pre.txt | head -16
done
for b in 1 256; do
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=40 timeout 90 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 8 -p 0 -n 32 -b $b -r 2 --mem-bw -1 > $O/$P-prof-kl-b$b.txt 2>&1
  echo "prof kl tg b$b rc=$? $(el)"; sed -n '/cuda profile/,/^| [a-z]/p' $O/$P-prof-kl-b$b.txt | head -24
done
echo "done $(el)"
