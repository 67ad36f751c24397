#!/bin/bash
# Session 59 call 1: the any-decay tensor-core KDA chunk (KdaDecays::Any: exact diagonal 16 x 16 blocks, the rest
# factored; Kimi-Linear's unbounded gate now takes kda_chunked_tc at --gemm-precision bf16). Tests: session 58's
# review mends (CudaKda.*, CudaMlaPrefillFlash.*, never run on a device), CudaKdaTc.* with the new AnyDecay test, the
# model tests (bounded / unbounded gate through the tensor-core KDA); the pieces' timing; pp4096 bf16 k3 vs k3old
# (f8c02e0, the session's start) alternating on the Kimi-Linear-dims 4-layer slice and the 12-layer KL48 dummy.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab f8c02e0)
BUDGET=${BUDGET:-420}
. scripts/perf/lib-call.sh
timeout 150 "$D/k3_cuda_tests" --gtest_filter='CudaKda.*:CudaMlaPrefillFlash.*:CudaKdaTc.*:*Bf16GemmTensorCoreKda*:CudaModelDummy.*:-*Timing*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|Failure|any-decay|factored|tensor-core KDA|gate (un)?bounded" "$OUT/tests.log" | head -80
xz -9 "$OUT/tests.log"
timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaKdaPrefill.*' 2>&1 | grep -E "timing|FAILED" | tee "$OUT/kda-prefill-pieces.txt"
echo "pieces done $(el)"
kl_dummy_args
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --gemm-precision bf16"
{ bin_ab 2 120 kl-4L-pp4096-bf16 $KLS
  ARM_TIMEOUT=60 bin_ab 2 40 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
