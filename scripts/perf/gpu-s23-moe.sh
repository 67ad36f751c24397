#!/bin/bash
# session 23 call 2 (issue 18 item 2): the ring MXFP4 decode kernel with lean per-chunk addressing: bitwise tests
# (ring / ring4 vs the register kernel), MoE + model tests, kernel timing on QAT scales, dummy K3-slice decode
# ring vs reg alternating (reg unchanged: the same-call control), ncu instruction count of the new ring at b64.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 560 - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork
mkdir -p /tmp/k3b && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
$T --gtest_filter='CudaMoe.*:CudaQuantMoe.*:Tiny/CudaModelE2E.*:-*Timing*' > $O/s23-2-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]" $O/s23-2-tests.log | head -20
echo "bitwise lines with 0 differing: $(grep -c ' 0 of ' $O/s23-2-tests.log), other: $(grep 'floats differ' $O/s23-2-tests.log | grep -vc ' 0 of ')"
K3_MOE_TIMING_SHAPES=qat timeout 150 $T --gtest_filter='CudaMoe.Timing' > $O/s23-2-moe-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -iE "decode" $O/s23-2-moe-timing.log | head -30
for r in 1 2; do for v in reg ring; do [ $(left) -gt 90 ] || break
  K3_MOE_DEC_VARIANT=$v timeout 100 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 0 -n 32 -b 1,8,64 -r 2 --mem-bw -1 > /tmp/k3s4-$v-$r.txt 2>&1
  echo "k3 slice $v r$r rc=$? $(el)"; grep -E "^\| " /tmp/k3s4-$v-$r.txt | grep tg | head -4 | sed "s/^/$v r$r /" | tee -a $O/s23-2-e2e.txt; done; done
timeout 60 ncu --kernel-name regex:dec_ring --launch-skip 12 --launch-count 2 --section SpeedOfLight --section InstructionStats --section ComputeWorkloadAnalysis \
  $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 0 -n 4 -b 64 -r 1 --enforce-eager > $O/s23-2-ncu-b64.txt 2>&1
grep -E 'dec_ring|Duration|DRAM Throughput|Executed Instructions  |Issue Slots Busy|Executed Ipc Active' $O/s23-2-ncu-b64.txt | head -14
echo "done $(el)"
