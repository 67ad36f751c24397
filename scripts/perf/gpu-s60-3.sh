#!/bin/bash
# Session 60 call 3 (the device refused five starts; ~250 s left): the CUDA suite without its timing tests, with the ring
# form v1 as Auto's MXFP4 prefill choice (the new default), 110 s at most; the ring form v2 (K3_MOE_RING_V2=1: 4
# warpgroups, one m64 tile each, 128-pair plan tiles, the next chunk decoded under the current chunk's wgmmas,
# decode_a_frags2) -- CudaMoe.* against the CPU and the shared-memory form, the K3 QAT bank's timing at n = 4096; the
# K3-dims 4-layer dummy pp4096 ring v1 / v2 at bf16x2, one round.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-225}
. scripts/perf/lib-call.sh
timeout 110 "$D/k3_cuda_tests" --gtest_filter='-*Timing*' > "$OUT/suite.log" 2>&1
echo "suite -*Timing* (ring v1 as Auto's) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]" "$OUT/suite.log" | head; grep -c "^\[       OK" "$OUT/suite.log"
xz -9 "$OUT/suite.log"
K3_MOE_RING_V2=1 timeout 50 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:-CudaMoe.*Timing' > "$OUT/tests-v2.log" 2>&1
echo "v2 tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|ring vs shared" "$OUT/tests-v2.log" | head -20
grep -E "wgring" "$OUT/tests-v2.log" | awk '{for(i=1;i<=NF;i++) if($i=="max_rel") print $(i-1), $(i+1)}' | sort -k2 -g | tail -3
xz -9 "$OUT/tests-v2.log"
[ "$(left)" -gt 60 ] && K3_MOE_RING_V2=1 K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout 35 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing-v2.log" 2>&1
echo "v2 timing rc=$? $(el)"; grep -E "timing.*(wg-|wgring|auto)" "$OUT/timing-v2.log"
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2"
{ [ "$(left)" -gt 40 ] && bench_arm "ring1 bf16x2" k3 "" $K3A
  [ "$(left)" -gt 20 ] && ARM_TIMEOUT=$(( $(left) - 3 )) bench_arm "ring2 bf16x2" k3 "K3_MOE_RING_V2=1" $K3A; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
