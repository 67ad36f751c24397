#!/bin/bash
# Session 48 call 3 (issue 18): the bf16 MoE down kernel's pairs forms (a warp per 4 rows of ONE pair's expert, blocks
# pair-major like the gate/up kernel, then a combine launch; K3_MOE_DOWN=pairs (2 chunks a batch) | pairs4 (4)) against
# rows4 (call s48-2's best) -- the same-bits test, ncu of the down and combine kernels, the Kimi-Linear-48B dummy (12
# layers) b1 alternating and b8; the model-level q8 test with its relative bars. Carry: .gpuwork/k3bins.tar.xz.
. scripts/perf/lib-call.sh
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMoe.GemvDownForms*:CudaMoe.SharedExpert*:CudaMoe.KimiLinearShape:CudaQuantModelQ8.*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |\[ q8 e2e|down pairs.*kimi|FAILED" $OUT/tests.log | head -30
kl_dummy_args
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for f in rows4 pairs pairs4; do
  K3_MOE_DOWN=$f timeout 60 $NCU --kernel-name regex:"gemv_down|down_combine|gemv_gate_up" --launch-skip 30 --launch-count 3 --section SpeedOfLight --section Occupancy \
    --section LaunchStats $D/k3 bench offline $KL -p 0 -n 4 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu $f rc=$? $(el)"
  grep -E "gemv_down|down_combine|gemv_gate_up|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves Per SM" /tmp/ncu.txt | cut -c1-110 | head -24
done | tee $OUT/ncu-down.txt
ab_rounds 2 150 "kl b1" "rows4 k3 K3_MOE_DOWN=rows4" "pairs k3 K3_MOE_DOWN=pairs" $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee $OUT/ab-kl.txt
ab_rounds 2 110 "kl b1" "pairs4 k3 K3_MOE_DOWN=pairs4" "pairs k3 K3_MOE_DOWN=pairs" $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee -a $OUT/ab-kl.txt
ab_rounds 1 70 "kl b8" "rows4 k3 K3_MOE_DOWN=rows4" "pairs k3 K3_MOE_DOWN=pairs" $KL -p 0 -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-kl.txt
echo "done $(el)"
