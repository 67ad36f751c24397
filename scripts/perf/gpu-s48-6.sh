#!/bin/bash
# Session 48 call 6 (issues 15 / 18): the MXFP4 experts' GEMV path with each batch of groups' loads in flight together
# (quad_dots_mx) and its down kernel pair-major (as the bf16 one's) -- the same-bits test, the MoE shape tests; the kl48
# Q4_K_M GGUF b1 / b2 and a K3-dims dummy (3 layers) b1 with the rule (the ring decode kernels) against K3_MOE_GEMV=2;
# ncu of the GEMV kernels. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMoe.GemvMx*:CudaMoe.GemvDown*:CudaMoe.TinyShapes:CudaMoe.K3Shape*:CudaMoe.KimiLinearShape' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED|mx down pairs vs items: k3 qat" $OUT/tests.log | head -12
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 3"
env_ab 2 380 "k3 b1" ring "" gemv K3_MOE_GEMV=2 $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
grep -iE "error|what" /tmp/arm.txt | head -3
wait $QB; tail -1 /tmp/q48.log
env_ab 2 250 "gguf b1" ring "" gemv K3_MOE_GEMV=2 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
env_ab 1 220 "gguf b2" ring "" gemv K3_MOE_GEMV=2 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 2 -r 2 | tee -a $OUT/ab-gguf.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ $(left) -gt 90 ] && K3_MOE_GEMV=2 timeout 70 $NCU --kernel-name regex:"gemv_gate_up_mx|gemv_down_mx|down_combine" --launch-skip 40 --launch-count 6 \
    --section SpeedOfLight --section Occupancy $D/k3 bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 2 -b 1 -r 1 > /tmp/ncu.txt 2>&1
grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput|Achieved Occ|Registers Per" /tmp/ncu.txt | cut -c1-100 | head -30 | tee $OUT/ncu-moe.txt
echo "done $(el)"
