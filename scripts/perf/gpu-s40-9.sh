#!/bin/bash
# Prepared in session 40, NOT YET RUN (the device budget was spent): the fused MLA prefill (mla_prefill_flash.cu,
# opt-in K3_MLA_PREFILL=flash) on its first device call -- its tests (float64 reference; flash vs the SGEMM form on
# the Kimi-Linear-dims dummy), compute-sanitizer memcheck of the kernel test, then pp4096 of the Kimi-Linear-dims and
# K3-dims 4-layer dummies with flash vs fp32 alternating, and a profile of each (K3_CUDA_PROFILE_SKIP=1).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of the commit to test).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${PFX:-flash-1}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 150 $T --gtest_filter='CudaMlaPrefillFlash.*:CudaModelDummy.MlaPrefillFlash*' > $O/$P-tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|flash" $O/$P-tests.log | head -30
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 200 $CS --tool memcheck $T --gtest_filter='CudaMlaPrefillFlash.*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4
for r in 1 2; do for pre in kimi-linear-48b-a3b kimi-k3; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 60 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "$pre $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done; done | tee $O/$P-pp.txt
for pre in kimi-linear-48b-a3b kimi-k3; do
  K3_MLA_PREFILL=flash K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 90 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-prof-$pre.txt 2>&1
  echo "prof $pre rc=$?"; grep -E "mla attn|linear|moe experts" $O/$P-prof-$pre.txt
done
xz -9 $O/$P-tests.log $O/$P-memcheck.log; echo "done $(el)"
