#!/bin/bash
# Session 60 call 1: session 59's review mends (compiled, never run on a device) and this session's ring form of the
# MXFP4 prefill expert tiles: CudaMoe.* (wgring paths beside every other), CudaLinearGroup.*, CudaKdaTc.*,
# CudaModelDummy.*, *Bf16GemmTensorCoreKda*; memcheck + racecheck of the tiny shapes (ring included); the K3 QAT bank's
# prefill expert timing (wg / wgrs / wgring at n = 256, 2048, 4096); the K3-dims 4-layer dummy pp4096 with
# K3_MOE_WGMMA=ring against the default, alternating, both precisions.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 170 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:CudaLinearGroup.*:CudaKdaTc.*:CudaModelDummy.*:*Bf16GemmTensorCoreKda*:-CudaMoe.Timing:CudaMoe.RouteTiming' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/tests.log" | head -30
grep -E "wgring" "$OUT/tests.log" | awk '{print $2, $NF, $(NF-3)}' | sort | uniq -c | sort -k4 -g | tail -4
xz -9 "$OUT/tests.log"
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 100 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing.log" 2>&1
echo "timing rc=$? $(el)"; grep -E "timing.*(wg|auto)" "$OUT/timing.log"
for tool in memcheck racecheck; do
  [ "$(left)" -gt 200 ] || break
  timeout 80 $CS --tool $tool "$D/k3_cuda_tests" --gtest_filter='CudaMoe.TinyShapes' > /tmp/cs.log 2>&1
  echo "$tool rc=$? $(el) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done | tee "$OUT/sanitizers.txt"
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2"
{ env_ab 2 60 k3-4L-pp4096-bf16x2 wg "" ring "K3_MOE_WGMMA=ring" $K3A
  env_ab 2 40 k3-4L-pp4096-bf16 wg "" ring "K3_MOE_WGMMA=ring" $K3A --gemm-precision bf16; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
