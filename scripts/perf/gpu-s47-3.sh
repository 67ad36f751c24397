#!/bin/bash
# Session 47 call 3 (issue 18): the one-token bf16 GEMV's batched form on trial (K3_GEMV1=batch[:N]). The pdl and
# linear tests (the same-bits test of the batched form among them); the bf16 projection chain timing (loop vs batch
# caps 3 / 5 / 9 vs a plain read, Kimi-Linear shapes); the Kimi-Linear-48B dummy (12 layers on an H100) batch 1, three
# alternating rounds of the default, K3_GEMV1=batch and K3_GEMV1=batch:5; then ncu's memory-workload and warp-state
# sections on one launch of the bf16 MoE down kernel (why it reads at half of DRAM, call s47-2). Carry:
# .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins).
. scripts/perf/lib-call.sh
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaPdl.*:*Linear*:-*Timing*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]" $OUT/tests.log | head; xz -9 $OUT/tests.log
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenBf16Projections' 2>&1 | grep -E "bf16 |FAILED|PASSED" | tee $OUT/chain-bf16.txt
kl_dummy_args
for r in 1 2 3; do [ $(left) -gt 150 ] || break; for v in loop batch batch:5; do
  E=""; [ $v != loop ] && E="K3_GEMV1=$v"
  env $E timeout 40 $D/k3 bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-kl-dummy.txt
[ $(left) -gt 70 ] && { timeout 90 ncu --kernel-name regex:gemv_down_kernel --launch-skip 30 --launch-count 1 --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section SourceCounters $D/k3 bench offline $KL -p 0 -n 4 -b 1 -r 1 > $OUT/ncu-down-detail.txt 2>&1; echo "ncu rc=$? $(el)"; }
echo "done $(el)"
