#!/bin/bash
# Session 62: issue 18's prefill figures with the roofline column on session 62's code (the pipelined ring), on the
# card that comes (an H200 asked for): K3-dims slices (4 layers; 6 on an H200) at bf16 / bf16x2 / mxfp8 activations, the
# Kimi-Linear-48B dummy (whole on an H200, its first 12 layers on an H100) at bf16 / bf16x2, then the whole suite.
# Pack: scripts/gpu-pack-ab 9b1dc59 (k3 = session 62). Carry: .gpuwork
BUDGET=${BUDGET:-540}
. scripts/perf/lib-call.sh
kl_dummy_args
LS="4"; [ "$BW" = 4175 ] && LS="4 6"
for L in $LS; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 300 ] || break 2
  ARM_TIMEOUT=90 bench_arm "k3 ${L}L $prec" k3 "" --device cuda --load-format dummy --preset kimi-k3 --num-layers $L -p 4096 -n 0 -b 1 -r 2 \
    --peak-tflops 989 --gemm-precision $prec
done; done 2>&1 | tee "$OUT/k3-peak.txt"
[ "$(left)" -gt 280 ] && ARM_TIMEOUT=90 bench_arm "k3 4L mxfp8" k3 "" --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 \
  -n 0 -b 1 -r 2 --peak-tflops 989 --moe-activation-dtype mxfp8 2>&1 | tee -a "$OUT/k3-peak.txt"
for prec in bf16 bf16x2; do
  [ "$(left)" -gt 230 ] || break
  ARM_TIMEOUT=170 bench_arm "kl48 $prec" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989 --gemm-precision $prec
done 2>&1 | tee "$OUT/kl-peak.txt"
[ "$(left)" -gt 200 ] && cuda_suite
echo "done $(el)"
