#!/bin/bash
# Session 41 call 10 (an H100: H200s were refused three times): the whole CUDA suite on the session's final CUDA code
# (the fused MLA prefill refactored into its softmax / merge functions, the long-past kernel test), memcheck of the
# fused kernel's tests, and the 4-layer Kimi-Linear-dims pp4096 fused vs SGEMM form. Carry: .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${PFX:-s41-10}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 300 $T > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |flash prefill nh 1 n  700|flash vs" $O/$P-suite.log | head -12
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $CS --tool memcheck $T --gtest_filter='CudaMlaPrefillFlash.*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY" $O/$P-memcheck.log | head -2
for r in 1 2; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 60 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "kl4 $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done | tee $O/$P-pp.txt
xz -9 $O/$P-suite.log $O/$P-memcheck.log; echo "done $(el)"
