#!/bin/bash
# Ready for session 62's first call (written in session 61, not yet run): issue 18's prefill figures with the roofline
# column on the card the issue names (ask for nvidia-h200; on an H100 the Kimi-Linear dummy is its first 12 layers):
# the whole Kimi-Linear-48B dummy and the K3-dims slice at 4 layers (and 6 on an H200: 5 MoE layers' MXFP4 experts are
# 78 GB), pp4096, bf16 and bf16x2 (`--peak-tflops 989`);
# the K3 QAT bank's expert timing; then the whole CUDA suite.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
kl_dummy_args
LS="4"; [ "$BW" = 4175 ] && LS="4 6"
for L in $LS; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 330 ] || break 2
  ARM_TIMEOUT=90 bench_arm "k3 ${L}L $prec" k3 "" --device cuda --load-format dummy --preset kimi-k3 --num-layers $L -p 4096 -n 0 -b 1 -r 2 \
    --peak-tflops 989 --gemm-precision $prec
done; done 2>&1 | tee "$OUT/k3-peak.txt"
for prec in bf16 bf16x2; do
  [ "$(left)" -gt 250 ] || break
  ARM_TIMEOUT=170 bench_arm "kl48 $prec" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989 --gemm-precision $prec
done 2>&1 | tee "$OUT/kl-peak.txt"
K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=256,2048,4096 timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/timing.log" 2>&1
echo "timing rc=$? $(el)"; grep -E "timing.*(wg-|wgring)" "$OUT/timing.log"
[ "$(left)" -gt 210 ] && cuda_suite
echo "done $(el)"
