#!/bin/bash
# Session 41 call 4 (H200: the whole Kimi-Linear-48B dummy is 96 GB): the whole CUDA suite with the fused MLA prefill
# as the default; dummy Kimi-Linear-48B (all 27 layers) decode at batch 1 / 64 / 256 against the roofline (--mem-bw
# 4175, the H200's measured copy bandwidth) after session 40's clustered KDA decode kernel; its pp4096 with the fused
# MLA prefill vs the SGEMM form, alternating. Carry: .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${PFX:-s41-4}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 300 $T > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran" $O/$P-suite.log | head -20
timeout 200 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 0 -n 64 -b 1,64,256 -r 2 --mem-bw 4175 > $O/$P-kl-tg.txt 2>&1
echo "kl tg rc=$? $(el)"; grep -E "^\| " $O/$P-kl-tg.txt | head -8
for r in 1 2; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 120 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "kl-48b $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done | tee $O/$P-kl-pp.txt
xz -9 $O/$P-suite.log; echo "done $(el)"
