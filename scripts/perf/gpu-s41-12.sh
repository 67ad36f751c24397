#!/bin/bash
# Session 41 call 12 (H100, the last of the budget): the final code's fused MLA prefill -- the K3-dims 4-layer dummy
# pp4096 fused vs SGEMM form, alternating, and ncu (speed of light, scheduler, warp states) of one fused launch at the
# Kimi-Linear dims. Carry: .gpuwork/k3bins.tar.xz.
set -u
O=$OUT; GW=$PWD/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
for r in 1 2; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 60 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "kimi-k3 $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$|error' /tmp/pp.txt)"; done; done | tee $O/s41-12-k3-pp.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 150 $NCU --kernel-name regex:mla_prefill_flash_kernel -c 1 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --mem-bw -1 > $O/s41-12-ncu.txt 2>&1
echo "ncu rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps" $O/s41-12-ncu.txt | head -10
