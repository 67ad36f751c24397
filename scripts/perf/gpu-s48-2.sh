#!/bin/bash
# Session 48 call 2 (issue 18; 15's GGUF): the bf16 MoE down kernel's rows forms (a warp per k over 2 or 4 rows;
# K3_MOE_DOWN=items | rows2 | rows4) -- the same-bits test, ncu of each form (one launch pair), the Kimi-Linear-48B dummy
# (12 layers) b1 alternating and b8; the model-level q8 test (Q4_K + Q5_0 k3-tiny, two GPU models); the q8 GEMV held
# to 64 registers (chain, early vs late; kl48 GGUF b1). Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMoe.GemvDownForms*:CudaMoe.SharedExpert*:CudaMoe.KimiLinearShape:CudaMoe.TinyShapes:CudaQuantModelQ8.*:CudaQuantKernels.Q8*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |\[ q8 e2e|down rows4\+perm vs items: kimi|FAILED" $OUT/tests.log | head -30
for e in 0 1; do
  echo "K3_Q8_EARLY=$e"; K3_Q8_EARLY=$e timeout 60 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenProjections' 2>&1 | grep -E " q8 .*us per projection"
done | tee $OUT/chain.txt
kl_dummy_args
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for f in items rows2 rows4; do
  K3_MOE_DOWN=$f timeout 60 $NCU --kernel-name regex:gemv_down --launch-skip 20 --launch-count 2 --section SpeedOfLight --section Occupancy \
    --section LaunchStats $D/k3 bench offline $KL -p 0 -n 4 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu $f rc=$? $(el)"
  grep -E "gemv_down|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves Per SM|Block Size" /tmp/ncu.txt | head -16
done | tee $OUT/ncu-down.txt
ab_rounds 2 260 "kl b1" "items k3 K3_MOE_DOWN=items" "rows4 k3 K3_MOE_DOWN=rows4" $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee $OUT/ab-kl.txt
ab_rounds 2 230 "kl b1" "rows2 k3 K3_MOE_DOWN=rows2" "rows4 k3 K3_MOE_DOWN=rows4" $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee -a $OUT/ab-kl.txt
ab_rounds 1 200 "kl b8" "items k3 K3_MOE_DOWN=items" "rows4 k3 K3_MOE_DOWN=rows4" $KL -p 0 -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-kl.txt
wait $QB; tail -1 /tmp/q48.log
env_ab 2 60 "gguf b1" early "" late K3_Q8_EARLY=0 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
echo "done $(el)"
