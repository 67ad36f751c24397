#!/bin/bash
# Session 41 call 6 (H200: the whole Kimi-Linear-48B dummy is 98 GB): the fused MLA prefill's tweaks (O rescaled only
# when a row's max moved; packed bf16x2 splits) -- tests, memcheck, pp4096 of the 4-layer Kimi-Linear-dims dummy
# against the SGEMM form, alternating; then the whole dummy Kimi-Linear-48B: decode b1 / b64 / b256 against the
# roofline (--mem-bw 4175, the H200's measured copy bandwidth; the bench now holds the b256 states once), and
# profiles of its pp4096 and b256 decode (SKIP_WHOLE=1: the 4-layer part only, for an H100). Carry:
# .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${PFX:-s41-6}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 150 $T --gtest_filter='CudaMlaPrefillFlash.*:CudaModelDummy.MlaPrefillFlash*' > $O/$P-tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|flash vs" $O/$P-tests.log | head -8
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 200 $CS --tool memcheck $T --gtest_filter='CudaMlaPrefillFlash.*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY" $O/$P-memcheck.log | head -2
for r in 1 2; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 60 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "kl4 $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done | tee $O/$P-pp.txt
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 90 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-prof-kl4.txt 2>&1
echo "prof kl4 rc=$? $(grep 'mla attn' $O/$P-prof-kl4.txt)"
[ "${SKIP_WHOLE:-0}" = 1 ] && { xz -9 $O/$P-tests.log $O/$P-memcheck.log; echo "done (4-layer part only) $(el)"; exit 0; }
timeout 200 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 0 -n 64 -b 1,64,256 -r 2 --mem-bw 4175 > $O/$P-kl-tg.txt 2>&1
echo "kl tg rc=$? $(el)"; grep -E "^\| |error" $O/$P-kl-tg.txt | head -6
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 120 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-kl-prof-pp.txt 2>&1
echo "prof pp rc=$? $(el)"; head -12 $O/$P-kl-prof-pp.txt | grep -E "ms|pp4096"
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 120 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 0 -n 16 -b 256 -r 1 --mem-bw -1 > $O/$P-kl-prof-b256.txt 2>&1
echo "prof b256 rc=$? $(el)"; head -12 $O/$P-kl-prof-b256.txt | grep -E "ms|tg16"
xz -9 $O/$P-tests.log $O/$P-memcheck.log; echo "done $(el)"
