#!/bin/bash
# session 39 call 4 (issue 18): the register-A wgmma MoE form now takes tiles of <= 48 pairs only, full tiles the
# shared-memory body in the same launch (s39-3: the 64-pair register body spilled and lost at n = 4096): timing beside
# the shared-memory form (K3 QAT bank n = 256 / 2048 / 4096), end to end (dummy K3 4 layers pp4096, K3_MOE_WGMMA=1 vs
# rs alternating), then the whole CUDA suite (the stage_mla fix, the new tests).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-570} - $(date +%s) + T0 )); }
O=$OUT; P=s39-4; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
ulimit -c 0
export K3_SHARED_DIR=/nonexistent
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 200 stdbuf -oL $T --gtest_filter=CudaMoe.Timing > $O/$P-timing.log 2>&1
echo "timing rc=$? $(el)"; grep -E " wg|auto" $O/$P-timing.log | cut -c1-150
for r in 1 2; do for wg in 1 rs; do [ $(left) -gt 300 ] || break
  K3_MOE_WGMMA=$wg timeout 40 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "k3 4L pp4096 K3_MOE_WGMMA=$wg rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done | tee $O/$P-k3-pp.txt
timeout $(( $(left) - 10 )) stdbuf -oL $T --gtest_filter='-*Timing*' > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure|KDA|MLA\)" $O/$P-suite.log | head -16; xz -9 $O/$P-suite.log
echo "done $(el)"
