#!/bin/bash
# Session 41 call 7 (call 9 with WHOLE=1): the fused MLA prefill's tests; long prefill with the fused MLA kernel -- pp32768 of the 4-layer Kimi-Linear-dims and K3-dims
# dummies, fused vs the SGEMM form, alternating (at 32k tokens the attention's quadratic work dominates a pass), and
# a profile of each; then (WHOLE=1, an H200: 98 GB) the whole dummy Kimi-Linear-48B decode b1 / b64 / b256 against
# the roofline (--mem-bw 4175) and profiles of its pp4096 and b256 decode. Carry: .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${PFX:-s41-7}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 150 $T --gtest_filter='CudaMlaPrefillFlash.*:CudaModelDummy.MlaPrefillFlash*' > $O/$P-tests.log 2>&1
echo "flash tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|flash vs" $O/$P-tests.log | head -6; xz -9 $O/$P-tests.log
if [ "${WHOLE:-0}" = 1 ]; then
  timeout 200 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 0 -n 64 -b 1,64,256 -r 2 --mem-bw 4175 > $O/$P-kl-tg.txt 2>&1
  echo "kl tg rc=$? $(el)"; grep -E "^\| |error" $O/$P-kl-tg.txt | head -6
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 120 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-kl-prof-pp.txt 2>&1
  echo "prof pp rc=$? $(el)"; grep -E " ms |pp4096" $O/$P-kl-prof-pp.txt | head -9
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 120 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 0 -n 16 -b 256 -r 1 --mem-bw -1 > $O/$P-kl-prof-b256.txt 2>&1
  echo "prof b256 rc=$? $(el)"; grep -E " ms |tg16" $O/$P-kl-prof-b256.txt | head -9
fi
for r in 1 2; do for pre in kimi-linear-48b-a3b kimi-k3; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 150 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 32768 -n 0 -b 1 -r 2 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "$pre $m round $r rc=$? $(grep -E '^\| .*pp32768 .*[0-9] \|$|error' /tmp/pp.txt)"; done; done; done | tee $O/$P-pp32k.txt
for pre in kimi-linear-48b-a3b kimi-k3; do
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 150 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 32768 -n 0 -b 1 -r 1 --mem-bw -1 > $O/$P-prof32k-$pre.txt 2>&1
  echo "prof32k $pre rc=$? $(el)"; grep -E " ms " $O/$P-prof32k-$pre.txt | head -8
done
echo "done $(el)"
