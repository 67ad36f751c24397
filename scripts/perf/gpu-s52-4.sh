#!/bin/bash
# Session 52 call 4 (issue 18 item 2): the MXFP4 decode kernels' FP8 form (K3_MOE_DEC_VARIANT=fp8, moe_decode_fp8.cu)
# -- correctness against the CPU reference (CudaMoe.DecodeFp8MatchesCpu; the bit-equality of the other variants
# unchanged), the kernel timing at the QAT-scaled K3 shape (n = 1 / 8 / 64: reg, ring, ring4, fp8 in one process), and
# the K3-dims dummy slice end to end, ring vs fp8 alternating. Carry: .gpuwork/k3bins.tar.xz.
BUDGET=560
. scripts/perf/lib-call.sh
timeout 240 $D/k3_cuda_tests --gtest_filter='CudaMoe.DecodeFp8MatchesCpu:CudaMoe.DecodeVariantsBitwise' > $OUT/moe-tests.log 2>&1
echo "moe tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|dec-bf16x2|  auto" $OUT/moe-tests.log | head -40
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout 200 $D/k3_cuda_tests --gtest_filter='CudaMoe.Timing' > $OUT/moe-timing.log 2>&1
echo "timing rc=$? $(el)"; grep -E "dec-bf16x2|  auto|  dec " $OUT/moe-timing.log | head -24
kl_dummy_args
NL=4; [ "$BW" = 3350 ] && NL=3
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers $NL --mem-bw $BW -p 0 -n 32 -d 512 -b 1,8,64 -r 2"
env_rows_ab K3_MOE_DEC_VARIANT "ring fp8" 60 90 $K3A
echo "done $(el)"
