#!/bin/bash
# session 38 call 3 (issue 18): the wgmma MoE prefill tiles as Auto's default (K3_MOE_WGMMA=0 opts out): the whole CUDA
# suite with them (k3-tiny in the tree this time); why `k3 bench --load-format dummy --preset kimi-k3` dies with SIGSEGV
# on the device (calls s36-1 / s38-0's "ncu exited 11", s38-1's pp runs: rc 139) -- a backtrace; a dummy Kimi-Linear
# pp4096 A/B. Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-480} - $(date +%s) + T0 )); }
O=$OUT; P=s38-3; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
ulimit -c 0
timeout 40 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 2 -p 512 -n 0 -b 1 -r 1 --mem-bw -1 > $O/$P-dummy-k3.txt 2>&1
echo "dummy k3 rc=$? $(el)"; tail -5 $O/$P-dummy-k3.txt | cut -c1-200
if command -v gdb > /dev/null; then
  timeout 60 gdb -batch -ex run -ex bt -ex "info threads" --args $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 2 -p 512 -n 0 -b 1 -r 1 --mem-bw -1 > $O/$P-dummy-k3-gdb.txt 2>&1
  echo "gdb rc=$? $(el)"; grep -E "^#[0-9]+ " $O/$P-dummy-k3-gdb.txt | head -14 | cut -c1-220
else echo "no gdb"; fi
export K3_SHARED_DIR=/nonexistent
timeout $(( $(left) - 60 )) stdbuf -oL $T --gtest_filter='-*Timing*' > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure" $O/$P-suite.log | head -12; xz -9 $O/$P-suite.log
for r in 1 2; do for wg in 0 1; do [ $(left) -gt 15 ] || break
  K3_MOE_WGMMA=$wg timeout 15 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "kl pp K3_MOE_WGMMA=$wg rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done | tee $O/$P-kl-pp.txt
echo "done $(el)"
