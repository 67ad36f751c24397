#!/bin/bash
# session 32 call 3 (issues 15 / 18): where a one-token projection's time goes. CudaPdl.* (incl. the early reader that
# shows the harness can fail), then CudaPdl.TimingChainOfOneTokenProjections with and without K3_PDL=0 (a graph of
# 24+ distinct one-token projections: the fp32 v3 GEMV, the tensor-core kernel, a plain read of the same bytes), and
# ncu (--set full, real clocks) of one v3 launch, one tensor-core launch and one plain read inside that chain.
# Carry: .gpuwork/deps.tar.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 560 - $(date +%s) + T0 )); }
O=$OUT; P=s32-3
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3_cuda_tests" . scripts/gpu-build; echo "built $(el)"
T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
timeout 60 $T --gtest_filter='CudaPdl.*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
K3_PDL=0 timeout 60 $T --gtest_filter='CudaPdl.*:-*Timing*' >> $O/$P-tests.log 2>&1; echo "tests K3_PDL=0 rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |Failure|began' $O/$P-tests.log | head
for r in 1 2; do
  timeout 90 $T --gtest_filter='CudaPdl.TimingChain*' 2>&1 | grep -E "^pdl|per projection" >> $O/$P-chain.txt
  K3_PDL=0 timeout 90 $T --gtest_filter='CudaPdl.TimingChain*' 2>&1 | grep -E "^pdl|per projection" >> $O/$P-chain.txt
done; cat $O/$P-chain.txt; echo "chain $(el)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in quant_gemv_v3_kernel quant_mma_kernel read_bytes_kernel; do
  [ $(left) -gt 60 ] || break
  timeout $(( $(left) - 20 )) $NCU --clock-control none --set full -k regex:$k -s 40 -c 1 $T --gtest_filter='CudaPdl.TimingChain*' > $O/$P-ncu-$k.txt 2>&1
  echo "ncu $k rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|One or More" $O/$P-ncu-$k.txt | head -14
done
echo "done $(el)"
