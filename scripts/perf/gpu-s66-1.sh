#!/bin/bash
# Session 66 call 1: session 65's gpu-s65-1.sh (never run: every start refused; removed, this is its body) with the MXFP4 x q8 prototype and the
# engine's decode rows first (they decide what comes next), then session 64's narrow-decode tests, timing and A/B.
# Session 65 call 1 (session 64's gpu-s64-2.sh, never run, renamed, with the q8 prototype after its tests): the ring's narrow-scale decode (banks whose MXFP4 scales are all <= 2^1 -- trained and QAT
# weights, the dummy K3 -- decode with one multiply and no NaN / overflow tests; K3_RING_NARROW=0 keeps the general one).
# 1. the ring / MXFP8 / model tests (RingNarrowScalesMatchGeneralBitwise: its first run); 2. timing of the K3 QAT bank
# at n = 2048 / 4096, narrow and general, with the bank's skewed routing and balanced (K3_MOE_TIMING_BIAS=0); 3. the K3-dims 4-layer pp4096 / pp2048 at bf16 and bf16x2, alternating arms;
# 4. ncu of gate+up (instructions, issue, stalls) in both forms; 5. on an H200 the whole Kimi-Linear-48B pp4096;
# 6. the suite if time is left. Pack: scripts/gpu-pack-bins at the session's ring commit. Carry: .gpuwork
BUDGET=${BUDGET:-530}
. scripts/perf/lib-call.sh
# Session 65: the MXFP4 x q8 dp4a decode prototype (scripts/perf/mxfp4_q8_bench.cu; carry .gpuwork/mxfp4_q8_bench)
# -- its check, then K3's expert shapes at n = 1 / 8 / 64, and the engine's decode rows at the same n in this process
# order (CudaMoe.Timing, K3 QAT bank).
"$GW/mxfp4_q8_bench" selftest; timeout 60 "$GW/mxfp4_q8_bench" check 2>&1 | tee "$OUT/q8-check.txt"; echo "q8 check rc=$? $(el)"
for n in 1 8 64; do timeout 60 "$GW/mxfp4_q8_bench" time $n 20; echo "q8 time $n rc=$? $(el)"; done 2>&1 | tee "$OUT/q8-time.txt"
# Where the prototype's gate|up time goes at n = 8 (its first launch: tiles of one pair, the minb=1 variant).
[ "$(left)" -gt 200 ] && timeout 60 ncu --kernel-name regex:gateup_q8 --launch-count 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy "$GW/mxfp4_q8_bench" time 8 1 > "$OUT/q8-ncu.txt" 2>&1
echo "q8 ncu rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots|Warp Cycles Per Issued" "$OUT/q8-ncu.txt" | head -10
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout 90 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing-dec.log" 2>&1
echo "engine decode timing rc=$? $(el)"; grep -E "timing" "$OUT/moe-timing-dec.log" | grep -E "auto|w4a8|dec" | cut -c1-170 | head -30
timeout 150 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Ring*:CudaMoe.Mxfp8TilesMatchCpuMxfp8:*CudaModelE2E.*:CudaModelDummy.*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|narrow-scale|ring vs shared" "$OUT/tests.log" | head -30
# The session-64 refactors' tests (moe_experts_body's GGUF path choice, the mma.sync MLA decode kernel's helpers).
timeout 90 "$D/k3_cuda_tests" --gtest_filter='CudaQuantMoe.*:CudaMlaDecode.*' > "$OUT/refactor-tests.log" 2>&1
echo "refactor tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]" "$OUT/refactor-tests.log" | head
# The last arm: balanced routing (no correction bias; K3_MOE_TIMING_BIAS=0), what a trained router's loads look like.
for v in "" "K3_RING_NARROW=0" "K3_MOE_TIMING_BIAS=0" "K3_MOE_TIMING_BIAS=0 K3_RING_NARROW=0"; do
  env $v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=2048,4096 timeout 50 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > /tmp/tm.log 2>&1
  echo "[$v] timing rc=$? $(el)"; grep -E "timing.*(wgring|routing)" /tmp/tm.log
done 2>&1 | tee "$OUT/timing.txt"
for p in 4096 2048; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 200 ] || break 2
  env_ab 2 200 "k3 4L pp$p $prec" narrow "" general "K3_RING_NARROW=0" --device cuda --load-format dummy --preset kimi-k3 \
    --num-layers 4 -p $p -n 0 -b 1 -r 2 --peak-tflops 989 --gemm-precision $prec
done; done 2>&1 | tee "$OUT/k3-ab.txt"
for v in "" "K3_RING_NARROW=0"; do
  [ "$(left)" -gt 150 ] || break
  env $v K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout 60 ncu --kernel-name regex:expert_ring --launch-count 1 \
    --section SpeedOfLight --section InstructionStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring${v:+-general}.txt" 2>&1
  echo "ncu [$v] rc=$? $(el)"; grep -E "Duration|Executed Instructions  |Issue Slots Busy|Stall Math|Stall Barrier" "$OUT/ncu-ring${v:+-general}.txt" | head -8
done
kl_dummy_args
[ "$BW" = 4175 ] && [ "$(left)" -gt 130 ] && ARM_TIMEOUT=$(( $(left) - 20 )) bench_arm "kl48 bf16" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 \
  --peak-tflops 989 --gemm-precision bf16 2>&1 | tee "$OUT/kl-peak.txt"
if [ "$(left)" -gt 110 ]; then cuda_suite; fi
echo "done $(el)"
