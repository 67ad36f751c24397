#!/bin/bash
# session 39 call 2 (issue 18): (a) the KDA-only model fix (dummy kimi-k3 --num-layers 1 / 2 crashed in stage_mla:
# call s39-1) -- the runs again + the new CudaModelDummy test; (b) the register-A form of the wgmma MoE tiles
# (MoePath::WgmmaRs, K3_MOE_WGMMA=rs): CudaMoe correctness, timing beside the shared-memory form (K3 QAT bank,
# n = 256 / 2048 / 4096), and ncu of both at n = 2048 (what moved: L1 / shared pipe, tensor pipe).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of this commit).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-560} - $(date +%s) + T0 )); }
O=$OUT; P=s39-2; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
ulimit -c 0
for L in 1 2 3; do
  timeout 60 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers $L -p 512 -n 8 -b 1 -r 1 --mem-bw -1 > $O/$P-k3-L$L.txt 2>&1
  echo "== dummy kimi-k3 --num-layers $L rc=$? $(el)"; grep -E '^\| kimi' $O/$P-k3-L$L.txt; grep -A3 "fatal signal" $O/$P-k3-L$L.txt | head -4
done
export K3_SHARED_DIR=/nonexistent
timeout 120 stdbuf -oL $T --gtest_filter='CudaModelDummy.*:CudaMoe.*-*Timing*' > $O/$P-tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure|wgrs|KDA layers|skipped" $O/$P-tests.log | grep -v "^\[ moe \] tiny.*wgrs-bf16 " | head -40
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 200 stdbuf -oL $T --gtest_filter=CudaMoe.Timing > $O/$P-timing.log 2>&1
echo "timing rc=$? $(el)"; grep -E "wg|n= *[0-9]+ .*(auto|tc-bf16x2)" $O/$P-timing.log | cut -c1-170
# expert_wg_kernel launches at n = 2048 (two per moe_experts call, warm-up + 3 timed): Auto (the shared-memory form)
# 0-7, wg-bf16x2 8-15, wg-bf16 16-23, wgrs-bf16x2 24-31: launch 0 / 24 are the gate+up of each form, bf16x2.
for sk in 0:ss 24:rs; do [ $(left) -gt 90 ] || break
  tag=${sk#*:}
  K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048 timeout $(( $(left) - 30 )) ncu --kernel-name regex:expert_wg_kernel --launch-skip ${sk%:*} --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
    --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum \
    -o $O/$P-ncu-$tag $T --gtest_filter=CudaMoe.Timing > /tmp/ncu-$tag.log 2>&1
  echo "ncu $tag rc=$? $(el)"; tail -2 /tmp/ncu-$tag.log
  ncu --import $O/$P-ncu-$tag.ncu-rep --page details --print-units base 2>/dev/null > $O/$P-ncu-$tag.txt
  grep -E 'expert_wg|Duration|DRAM Throughput|Memory Throughput|Registers Per|Issue Slots Busy|No Eligible|Eligible Warps|Executed Ipc|L1/TEX Hit|wavefronts|pipe_tensor|local_op' $O/$P-ncu-$tag.txt | head -24
  rm -f $O/$P-ncu-$tag.ncu-rep
done
echo "done $(el)"
