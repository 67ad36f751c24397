#!/bin/bash
# Session 52 call 2 (issue 18 item 3): the wgmma MLA decode kernel in 32-key tiles, four stages (K3_MLA_WG_TILE=32)
# against session 50's 64-key tiles, two stages (the default): the MLA decode tests (both tilings against the CPU, and
# against each other), compute-sanitizer memcheck / racecheck / synccheck on the new tiling, the BF16 kernel timing
# (nh 32 / 96, 1k-128k, batch 1-256; one process times tc, wgmma 64 and wgmma 32 per shape), and, if time is left, the
# K3-dims 4-layer dummy slice at depth 8192 with the bf16 cache under both tilings, alternating. Carry:
# .gpuwork/k3bins.tar.xz.
BUDGET=560
. scripts/perf/lib-call.sh
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.*' > $OUT/mla-tests.log 2>&1
echo "mla tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|tile 32 vs|tile 32 nh= 96" $OUT/mla-tests.log | head -20
CS=/usr/local/cuda/bin/compute-sanitizer
for tool in memcheck racecheck synccheck; do
  [ $(left) -gt 380 ] || break
  K3_MLA_WG_TILE=32 timeout 100 $CS --tool $tool $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > /tmp/cs.log 2>&1
  echo "$tool rc=$? $(el) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done | tee $OUT/sanitizers.txt
K3_MLA_TIMING_DTYPE=bfloat16 timeout 200 $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' > $OUT/mla-timing.log 2>&1
echo "timing rc=$? $(el)"; grep "timing" $OUT/mla-timing.log | head -40
kl_dummy_args
NL=4; [ "$BW" = 3350 ] && NL=3
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers $NL --mem-bw $BW --kv-cache-dtype bf16 -p 0 -n 32 -d 8192 -b 1,64 -r 2"
env_rows_ab K3_MLA_WG_TILE "64 32" 120 110 $K3A
echo "done $(el)"
