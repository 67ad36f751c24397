#!/bin/bash
# Session 58 call 1: session 57's review mend of the CUTLASS expert path run for the first time (CudaMoe.*), the MXFP8
# model test's re-derived prefill check, the MLA prefill kernel's bf16 form and the KDA prefill's bf16 planes (tests;
# pp4096 at --gemm-precision bf16: old = K3_MLA_PREFILL=x2 K3_KDA_PREFILL_IN=f32, mla = only the MLA form, new = both),
# where a KDA layer's prefill time goes (CudaKdaPrefill.TimingPieces, new), then the whole suite.
# Carry: .gpuwork/k3bins.tar.xz
BUDGET=${BUDGET:-585}
. scripts/perf/lib-call.sh
timeout 150 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:-*Timing*' > "$OUT/moe-tests.log" 2>&1
echo "moe tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED  \]" "$OUT/moe-tests.log" | head; xz -9 "$OUT/moe-tests.log"
timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMlaPrefillFlash.*:*MlaPrefillFlash*:*Bf16GemmBoundedGate*:CudaKda.*:-*Timing*' 2>&1 | grep -E "^\[ (mla|e2e|kda)|^\[  (FAILED|PASSED)|Failure|Expected|actual" | tee "$OUT/mla-tests.txt"
timeout 150 "$D/k3_cuda_tests" --gtest_filter='CudaKdaPrefill.*' 2>&1 | grep -E "timing|FAILED|PASSED" | tee "$OUT/kda-prefill-pieces.txt"
echo "pieces done $(el)"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --gemm-precision bf16"
for r in 1 2; do
  bench_arm "old r$r" k3 "K3_MLA_PREFILL=x2 K3_KDA_PREFILL_IN=f32" $KLS
  bench_arm "mla r$r" k3 "K3_KDA_PREFILL_IN=f32" $KLS
  bench_arm "new r$r" k3 "" $KLS
done | tee "$OUT/prefill-ab.txt"
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 60 "$D/k3" bench offline $KLS 2>&1 | grep -E "^  [a-z]|^\| kimi" | tee "$OUT/kl-prof-bf16.txt"
kl_dummy_args  # the whole Kimi-Linear-48B dummy on an H200, its first 12 layers on an 80 GB card
KLW="$KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16"
ARM_TIMEOUT=120 bench_arm "whole-kl48 old" k3 "K3_MLA_PREFILL=x2 K3_KDA_PREFILL_IN=f32" $KLW | tee -a "$OUT/prefill-ab.txt"
ARM_TIMEOUT=120 bench_arm "whole-kl48 new" k3 "" $KLW | tee -a "$OUT/prefill-ab.txt"
timeout 90 "$D/k3_cuda_tests" --gtest_filter='*Mxfp8*' 2>&1 | grep -E "^\[ e2e|^\[  (FAILED|PASSED)|Failure|Expected|actual|first row|median" | tee "$OUT/mxfp8-tests.txt"
timeout $(( $(left) - 15 )) "$D/k3_cuda_tests" --gtest_filter='-*Timing*:CudaMoe.*:*Mxfp8*:CudaKdaPrefill.*:CudaKda.*:CudaMlaPrefillFlash.*' > "$OUT/suite.log" 2>&1
echo "rest of suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED  \]" "$OUT/suite.log" | head -20
xz -9 "$OUT/suite.log"
echo "done $(el)"
