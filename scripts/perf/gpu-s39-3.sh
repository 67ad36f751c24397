#!/bin/bash
# session 39 call 3 (issue 18): the register-A wgmma MoE tiles with the activations copied asynchronously (cp.async, fp32)
# under the wgmmas instead of through registers (s39-2's form spilled: 22 GB of local loads at n = 2048): CudaMoe
# correctness, timing beside the shared-memory form (K3 QAT bank, n = 256 / 2048 / 4096), ncu at n = 2048, end to end
# (dummy K3 4 layers, pp4096, K3_MOE_WGMMA=1 vs rs alternating); the KDA-only prefill/decode diagnostic test.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-560} - $(date +%s) + T0 )); }
O=$OUT; P=s39-3; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
ulimit -c 0
export K3_SHARED_DIR=/nonexistent
timeout 120 stdbuf -oL $T --gtest_filter='CudaModelDummy.*:CudaMoe.*-*Timing*' > $O/$P-tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure|KDA|MLA\)" $O/$P-tests.log | head -12
grep -E "wgrs" $O/$P-tests.log | grep -v skipped | awk '{for(i=1;i<=NF;i++) if($i=="max_rel") print $(i+1), $0}' | sort -g | tail -3 | cut -c1-160
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 200 stdbuf -oL $T --gtest_filter=CudaMoe.Timing > $O/$P-timing.log 2>&1
echo "timing rc=$? $(el)"; grep -E " wg|auto" $O/$P-timing.log | cut -c1-150
for r in 1 2; do for wg in 1 rs; do [ $(left) -gt 150 ] || break
  K3_MOE_WGMMA=$wg timeout 40 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "k3 4L pp4096 K3_MOE_WGMMA=$wg rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done | tee $O/$P-k3-pp.txt
if [ $(left) -gt 100 ]; then
  K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048 timeout $(( $(left) - 30 )) ncu --kernel-name regex:expert_wg_kernel --launch-skip 24 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
    --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio \
    -o $O/$P-ncu-rs $T --gtest_filter=CudaMoe.Timing > /tmp/ncu-rs.log 2>&1
  echo "ncu rs rc=$? $(el)"; tail -2 /tmp/ncu-rs.log
  ncu --import $O/$P-ncu-rs.ncu-rep --page details --print-units base 2>/dev/null > $O/$P-ncu-rs.txt
  grep -E 'expert_wg|Duration|DRAM Throughput|Memory Throughput|Registers Per|Issue Slots Busy|No Eligible|Eligible Warps|Executed Ipc|wavefronts|pipe_tensor|local_op|stalled' $O/$P-ncu-rs.txt | head -40
  rm -f $O/$P-ncu-rs.ncu-rep
fi
echo "done $(el)"
