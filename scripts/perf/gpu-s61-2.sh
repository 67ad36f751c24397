#!/bin/bash
# Session 61's second call: the whole CUDA suite on the kept ring form (Auto's default), then the prefill roofline
# column (`--peak-tflops 989`, the H100 / H200 SXM dense bf16 rate) for issue 18's prefill target: the Kimi-Linear-48B
# dummy (whole on an H200, its first 12 layers on an H100) and the K3-dims 4-layer slice at pp4096, both precisions;
# clean profiles of both 4-layer slices at bf16.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
kl_dummy_args
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
for prec in bf16 bf16x2; do bench_arm "k3s4 $prec" k3 "" $K3A --gemm-precision $prec; done 2>&1 | tee "$OUT/k3-peak.txt"
for prec in bf16 bf16x2; do
  [ "$(left)" -gt 200 ] || break
  ARM_TIMEOUT=170 bench_arm "kl48 $prec" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989 --gemm-precision $prec
done 2>&1 | tee "$OUT/kl-peak.txt"
for pre in kimi-linear-48b-a3b kimi-k3; do [ "$(left)" -gt 240 ] || break  # where a bf16 pp4096 pass goes now
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 40 "$D/k3" bench offline --device cuda --load-format dummy --preset $pre \
    --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16 > /tmp/p.txt 2>&1
  echo "profile $pre bf16 rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi" /tmp/p.txt
done 2>&1 | tee "$OUT/profiles.txt"
[ "$(left)" -gt 210 ] && cuda_suite
echo "done $(el)"
