#!/bin/bash
# Ready for session 62's first call (written in session 61, not yet run). Pack: scripts/gpu-pack-ab edec2df (k3 +
# k3_cuda_tests = 7228fd7 or later: the ring taking MoePrecision::Mxfp8's tile form; k3old = edec2df: that form on the
# shared-memory wgmma tiles). Ask for nvidia-h200 (issue 18's card; on an H100 the Kimi-Linear dummy is 12 layers).
# 1. the MXFP8 tests (the ring's new epilogue: never run) + synccheck of its ring case; 2. the K3-dims 4-layer pp4096 with
# --moe-activation-dtype mxfp8, k3old / k3 alternating; 3. issue 18's prefill figures with the roofline column: K3 slices
# (4 layers; 6 on an H200), the whole Kimi-Linear-48B dummy, bf16 and bf16x2; 4. the expert timing; 5. the whole suite.
# Carry: .gpuwork/k3bins.tar.xz
BUDGET=${BUDGET:-570}
. scripts/perf/lib-call.sh
CS=/usr/local/cuda/bin/compute-sanitizer
timeout 90 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Mxfp8*:*Mxfp8MatchesCpuMxfp8*:CudaMoe.Ring*' > "$OUT/mxfp8-tests.log" 2>&1
echo "mxfp8 tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|mxfp8 tiles" "$OUT/mxfp8-tests.log" | head -24
timeout 60 $CS --tool synccheck "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Mxfp8TilesMatchCpuMxfp8' > /tmp/cs.log 2>&1
echo "synccheck mxfp8 rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
kl_dummy_args
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989"
bin_ab 2 300 pp4096-mxfp8 $K3A --moe-activation-dtype mxfp8 2>&1 | tee "$OUT/ab-mxfp8.txt"
LS="4"; [ "$BW" = 4175 ] && LS="4 6"
for L in $LS; do for prec in bf16 bf16x2; do
  [ "$(left)" -gt 260 ] || break 2
  ARM_TIMEOUT=90 bench_arm "k3 ${L}L $prec" k3 "" --device cuda --load-format dummy --preset kimi-k3 --num-layers $L -p 4096 -n 0 -b 1 -r 2 \
    --peak-tflops 989 --gemm-precision $prec
done; done 2>&1 | tee "$OUT/k3-peak.txt"
for prec in bf16 bf16x2; do
  [ "$(left)" -gt 210 ] || break
  ARM_TIMEOUT=170 bench_arm "kl48 $prec" k3 "" $KL -p 4096 -n 0 -b 1 -r 2 --peak-tflops 989 --gemm-precision $prec
done 2>&1 | tee "$OUT/kl-peak.txt"
[ "$(left)" -gt 200 ] && cuda_suite
echo "done $(el)"
