#!/bin/bash
# Session 41 call 11 (H100): the fused MLA prefill against the SGEMM form at mid lengths -- the 4-layer K3-dims dummy at
# pp8192 (16k / 32k do not fit an H100) and the Kimi-Linear-dims one at pp16384, alternating. Carry: .gpuwork/k3bins.tar.xz.
set -u
O=$OUT; GW=$PWD/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
for r in 1 2; do for c in "kimi-k3 8192" "kimi-linear-48b-a3b 16384"; do set -- $c; for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 100 $B bench offline --device cuda --load-format dummy --preset $1 --num-layers 4 -p $2 -n 0 -b 1 -r 2 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "$1 $m round $r rc=$? $(grep -E "^\| .*pp$2 .*[0-9] \|$|error" /tmp/pp.txt)"; done; done; done | tee $O/s41-11-pp.txt
