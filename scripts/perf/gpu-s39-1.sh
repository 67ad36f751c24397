#!/bin/bash
# session 39 call 1 (issue 18): (a) where `k3 bench --device cuda --load-format dummy --preset kimi-k3` dies -- the new
# fatal-signal report (core/crash_report.h) prints the faulting thread's stack (offsets resolved with addr2line against
# the unstripped build/cuda-carry/k3 on the dev box), with variants that bound it; (b) the CudaMoe tests with session
# 38's CC-9.0-strict assertions (never run); (c) ncu of the wgmma MoE prefill tiles (expert_wg_kernel, gate/up and down)
# at K3's QAT bank, n = 2048: what bounds them (tensor pipe, shared-memory pipe, stalls).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-560} - $(date +%s) + T0 )); }
O=$OUT; P=s39-1; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
ulimit -c 0
run_k3() {  # name, args...
  local n=$1; shift
  timeout 60 $B bench offline --device cuda --load-format dummy --preset kimi-k3 "$@" --mem-bw -1 > $O/$P-k3-$n.txt 2>&1
  echo "== $n rc=$? $(el): $*"; grep -vE '^\| (test|---)' $O/$P-k3-$n.txt | tail -22 | cut -c1-160
}
run_k3 L2-pp512 --num-layers 2 -p 512 -n 0 -b 1 -r 1
run_k3 L1-pp512 --num-layers 1 -p 512 -n 0 -b 1 -r 1
run_k3 L2-pp16 --num-layers 2 -p 16 -n 0 -b 1 -r 1
run_k3 L2-tg4 --num-layers 2 -p 0 -n 4 -b 1 -r 1
run_k3 L2-pp512-eager --num-layers 2 -p 512 -n 0 -b 1 -r 1 --enforce-eager
run_k3 L4-pp512 --num-layers 4 -p 512 -n 0 -b 1 -r 1
export K3_SHARED_DIR=/nonexistent
timeout 200 stdbuf -oL $T --gtest_filter='CudaMoe.*-*Timing*' > $O/$P-moe-tests.log 2>&1
echo "moe tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure|wg-" $O/$P-moe-tests.log | head -30
if [ $(left) -gt 150 ]; then
  K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048 timeout $(( $(left) - 20 )) ncu --kernel-name regex:expert_wg_kernel --launch-count 2 \
    --set full --import-source no -o $O/$P-ncu-wg $T --gtest_filter=CudaMoe.Timing > /tmp/ncu.log 2>&1
  echo "ncu rc=$? $(el)"; tail -3 /tmp/ncu.log
  ncu --import $O/$P-ncu-wg.ncu-rep --page details --print-units base 2>/dev/null > $O/$P-ncu-wg.txt
  grep -E 'expert_wg|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|Executed Ipc|Shared|L1/TEX Hit|L2 Hit|Compute \(SM\)' $O/$P-ncu-wg.txt | head -60
  ncu --import $O/$P-ncu-wg.ncu-rep --page raw --csv 2>/dev/null | xz -9 > $O/$P-ncu-wg-raw.csv.xz
  rm -f $O/$P-ncu-wg.ncu-rep
fi
echo "done $(el)"
