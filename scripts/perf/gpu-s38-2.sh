#!/bin/bash
# session 38 call 2 (issue 18 item 4, prefill): the routed experts' prefill tiles on warpgroup MMAs
# (sm90a/moe_prefill_wgmma.cu, MoePath::Wgmma; Auto's tensor-core path with K3_MOE_WGMMA=1), first run:
#  (1) the MoE correctness tests with the two new paths (wg-bf16x2, wg-bf16) beside every other, against the CPU;
#  (2) compute-sanitizer memcheck of the tiny shapes (every path, the new ones included);
#  (3) the whole model e2e with it: k3-tiny / tiny K3 CUDA-vs-CPU model tests with K3_MOE_WGMMA=1;
#  (4) CudaMoe.Timing on the K3 QAT bank and the Kimi-Linear bank: tc vs wg at n = 64 .. 4096;
#  (5) end to end prefill, dummy weights: the K3-dims 2-layer slice and a 4-layer Kimi-Linear, pp4096, K3_MOE_WGMMA
#      0 / 1 alternating, both GEMM precisions.
# Binaries: scripts/gpu-pack-bins of this commit. Carry: .gpuwork/k3bins.tar.xz (k3-tiny stays in the tree).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }
O=$OUT; P=s38-2; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; echo "unpacked $(el)"
export K3_SHARED_DIR=/nonexistent
timeout 150 $T --gtest_filter='CudaMoe.TinyShapes:CudaMoe.KimiLinearShape:CudaMoe.K3Shape:CudaMoe.K3ShapeQatScales:CudaMoe.EdgeCases' > $O/$P-moe-tests.log 2>&1
echo "moe tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|wg-" $O/$P-moe-tests.log | grep -E "FAILED|PASSED|Failure|n= *(1|64|257) " | head -30
K3_MOE_WGMMA=1 timeout 100 $T --gtest_filter='*CudaModelE2E.Prefill*:*CudaModelE2E.Paged*:CudaModelDummy.*' > $O/$P-model-tests.log 2>&1
echo "model tests (K3_MOE_WGMMA=1) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure" $O/$P-model-tests.log | head -8
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $CS --tool memcheck $T --gtest_filter='CudaMoe.TinyShapes' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4; xz -9 $O/$P-memcheck.log
K3_MOE_TIMING_SHAPES=qat,kl timeout 150 $T --gtest_filter='CudaMoe.Timing' > $O/$P-moe-timing.log 2>&1
echo "timing rc=$? $(el)"; grep -E "n= *(64|256|2048|4096) .*(tc-|wg-)" $O/$P-moe-timing.log | cut -c1-175
E=$O/$P-e2e.txt
pp() { local l=$1 wg=$2; shift 2; [ $(left) -gt 30 ] || return
  K3_MOE_WGMMA=$wg timeout 40 $B bench offline --device cuda --load-format dummy "$@" -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "## $l K3_MOE_WGMMA=$wg ($*) rc=$? $(el)" >> $E; grep -E "^\| .*pp4096 .*[0-9] \|$" /tmp/pp.txt >> $E; }
for r in 1 2; do
  for wg in 0 1; do pp k3-r$r $wg --preset kimi-k3 --num-layers 2; done
  for wg in 0 1; do pp k3-bf16-r$r $wg --preset kimi-k3 --num-layers 2 --gemm-precision bf16; done
  for wg in 0 1; do pp kl-r$r $wg --preset kimi-linear-48b-a3b --num-layers 4; done
done
cat $E; echo "done $(el)"
