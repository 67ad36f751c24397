#!/bin/bash
# Session 59 call 2: the exact diagonal blocks as a warp per row with running products of exp(g) and one
# reduce-scatter (s59-1's thread-per-pair form cost 0.11 ms over the factored kernel at 1 x 4096 x 32): the any-decay
# tests, the pieces' timing (three rounds), the Kimi-Linear-dims slice's profile at bf16 (where a pass goes now), and
# the 12-layer KL48 dummy pp4096 bf16 (three runs).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-300}
. scripts/perf/lib-call.sh
timeout 100 "$D/k3_cuda_tests" --gtest_filter='CudaKdaTc.AnyDecay*:CudaKdaTc.MatchesCpu*:*Bf16GemmTensorCoreKda*' > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)|FAILED  \]|Failure|factored|tensor-core KDA" "$OUT/tests.log" | head -30
grep -E "any-decay" "$OUT/tests.log" | awk '{print $NF, $(NF-2), $(NF-4)}' | sort -g | tail -3
xz -9 "$OUT/tests.log"
for r in 1 2 3; do timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaKdaPrefill.*' 2>&1 | grep -E "timing|FAILED"; done | tee "$OUT/kda-prefill-pieces.txt"
echo "pieces done $(el)"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --gemm-precision bf16"
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 60 "$D/k3" bench offline $KLS > /tmp/p.txt 2>&1
echo "profile rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi" /tmp/p.txt | tee "$OUT/kl-prof.txt"
kl_dummy_args
for r in 1 2 3; do ARM_TIMEOUT=60 bench_arm "k3 kl48-pp4096-bf16 r$r" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16; done | tee "$OUT/kl48.txt"
echo "done $(el)"
