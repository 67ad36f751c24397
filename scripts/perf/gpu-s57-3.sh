#!/bin/bash
# Session 57 call 3: CUTLASS's grouped GEMMs as Auto's choice for BF16 banks (the tile rule: 64 rows up to 96 pairs an
# expert), checked and timed again; the W4A8 prototype's tiled layout re-checked (the check's reference had read the
# tiled scales as row-major); prefill figures at --gemm-precision bf16 and bf16x2 with clean profiles (the warm-up pass
# skipped) on the Kimi-Linear-dims slice, the whole Kimi-Linear-48B and the K3-dims slice.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/w4a8_bench
BUDGET=${BUDGET:-440}
. scripts/perf/lib-call.sh
timeout 100 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.*:CudaModelE2E.*:CudaModelDummy.*:CudaQuantModel.*:-CudaMoe.Timing' > "$OUT/moe-tests.log" 2>&1
echo "moe tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|kimi-linear.*(auto|cutlass)" "$OUT/moe-tests.log" | cut -c1-160 | head -24
timeout 40 $GW/w4a8_bench check 2>&1 | tee $OUT/w4a8-check.txt; echo "w4a8 check rc=$? $(el)"
K3_MOE_TIMING_SHAPES=kl K3_MOE_TIMING_N=256,2048,4096 timeout 90 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing-kl.log" 2>&1
echo "kl timing rc=$? $(el)"; grep -E "auto|cutlass|wg-" "$OUT/moe-timing-kl.log" | cut -c1-150
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -n 0 -b 1 -r 3"
{ env_ab 2 300 pp4096-bf16 tiles "K3_MOE_CUTLASS=0" cutlass "" $KLS -p 4096 --gemm-precision bf16
  env_ab 1 260 pp512-bf16 tiles "K3_MOE_CUTLASS=0" cutlass "" $KLS -p 512 --gemm-precision bf16
  env_ab 1 230 pp4096 tiles "K3_MOE_CUTLASS=0" cutlass "" $KLS -p 4096
  for pre in kimi-linear-48b-a3b kimi-k3; do [ "$(left)" -gt 190 ] || break
    K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 40 "$D/k3" bench offline --device cuda --load-format dummy --preset $pre \
      --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16 > /tmp/p.txt 2>&1
    echo "profile $pre bf16 rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi" /tmp/p.txt
  done; } 2>&1 | tee "$OUT/kl-pp-ab.txt"
kl_dummy_args
if [ "$BW" = 4175 ]; then
  ARM_TIMEOUT=80 env_ab 1 100 kl48-pp4096-bf16 tiles "K3_MOE_CUTLASS=0" cutlass "" $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16 2>&1 | tee $OUT/kl48-pp.txt
fi
echo "done $(el)"
