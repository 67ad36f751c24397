#!/bin/bash
# Session 41: the fused MLA prefill v2 (PFX names the variant: s41-2 = 4 warps a block, s41-3 = 8 warps, key halves)
# its tests, the KDA tests (their cp.async / ldmatrix helpers moved to smem_ptx.cuh), memcheck, pp4096 flash vs
# fp32 alternating on the Kimi-Linear-dims and K3-dims 4-layer dummies, a profile, and ncu of one flash launch.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins of the commit to test).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=${PFX:-s41-2}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 200 $T --gtest_filter='CudaMlaPrefillFlash.*:CudaModelDummy.MlaPrefillFlash*:CudaKda*:-*Timing*' > $O/$P-tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|flash prefill|flash vs" $O/$P-tests.log | head -30
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
timeout 200 $CS --tool memcheck $T --gtest_filter='CudaMlaPrefillFlash.*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4
timeout 200 $CS --tool racecheck $T --gtest_filter='CudaMlaPrefillFlash.MatchesFloat64Reference' > $O/$P-racecheck.log 2>&1
echo "racecheck rc=$? $(el)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" $O/$P-racecheck.log | head -4
for r in 1 2; do for pre in kimi-linear-48b-a3b kimi-k3; do for m in flash fp32; do
  K3_MLA_PREFILL=$m timeout 60 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "$pre $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done; done | tee $O/$P-pp.txt
for pre in kimi-linear-48b-a3b kimi-k3; do for m in flash fp32; do
  K3_MLA_PREFILL=$m K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 90 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-prof-$pre-$m.txt 2>&1
  echo "prof $pre $m rc=$? $(grep -E 'mla attn' $O/$P-prof-$pre-$m.txt)"
done; done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
K3_MLA_PREFILL=flash timeout 240 $NCU --kernel-name regex:mla_prefill_flash_kernel -c 1 --set full $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --mem-bw -1 > $O/$P-ncu.txt 2>&1
echo "ncu rc=$? $(el)"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|L1/TEX Hit|Warp Cycles Per Issued" $O/$P-ncu.txt | head -14
xz -9 $O/$P-tests.log $O/$P-memcheck.log $O/$P-racecheck.log; echo "done $(el)"
