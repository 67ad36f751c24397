#!/bin/bash
# Session 58 call 4: the conv kernel with the next token's inputs prefetched and 16-token tiles (s58-3: the warp form
# at 32 tokens was slower than the block form in fp32, 0.266 vs 0.203 ms: 142 registers, 3 blocks an SM), as a warp
# per (head, tensor) (the default: ~60 registers) and per head (K3_KDA_CONV_FORM=qkv, ~130); the tests under both;
# pp4096 bf16 k3 vs k3old (97a845d) alternating.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 97a845d)
BUDGET=${BUDGET:-240}
. scripts/perf/lib-call.sh
timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaKda.*:-*Timing*' 2>&1 | grep -E "bf16 forms|^\[  (FAILED|PASSED)|Failure|Expected|actual" | tee "$OUT/kda-tests.txt"
K3_KDA_CONV_FORM=qkv timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaKda.ConvL2NormMatchesCpu:CudaKda.Bf16*' 2>&1 | grep -E "bf16 forms|^\[  (FAILED|PASSED)|Failure" | tee -a "$OUT/kda-tests.txt"
for f in tensor qkv tensor qkv; do
  K3_KDA_CONV_FORM=$f timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaKdaPrefill.*' 2>&1 | grep -E "timing" | sed "s/^/form=$f /"
done | tee "$OUT/kda-prefill-pieces.txt"
echo "pieces done $(el)"
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --gemm-precision bf16"
bin_ab 3 40 kl-pp4096-bf16 $KLS 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
