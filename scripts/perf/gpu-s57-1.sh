#!/bin/bash
# Session 57 call 1: CUTLASS's grouped GEMMs for BF16 experts at prefill sizes (MoePath::Cutlass, K3_MOE_CUTLASS=1),
# and session 56's unrun MXFP8 / W4A8 work (its call script gpu-s56-1.sh, trimmed).
# 1. the MoE / model suites without timings: CudaMoe.* runs cutlass-bf16x2 / cutlass-bf16 / cutlass64-bf16x2 beside
#    every other path on each BF16 bank against the CPU, EdgeCases its invalid ids; CudaMxfp8.*, CudaMoe.Mxfp8*,
#    CudaModelE2E.Mxfp8MatchesCpuMxfp8 (session 56, never run);
# 2. CudaMoe.Timing on the Kimi-Linear bank at n = 256 / 2048 / 4096: cutlass t128 / t64 beside the wgmma tiles;
# 3. the Kimi-Linear-dims 4-layer slice, pp4096, K3_MOE_CUTLASS 0 / 1 alternating (bf16x2; then bf16), and a profile;
# 4. w4a8_bench check + time (the tiled layout); k3-tiny perplexity float32 vs mxfp8 on the GPU; the K3-dims slice
#    float32 vs mxfp8 (decode b1 / 8 / 64, pp2048); memcheck of the new kernels; the K3 QAT bank's w4a8 timing row.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/w4a8_bench .gpuwork/persuasion-60k.txt
BUDGET=${BUDGET:-560}
. scripts/perf/lib-call.sh
F='CudaMxfp8.*:CudaMoe.*:CudaQuantMoe.*:CudaModelE2E.*:-CudaMoe.Timing:CudaQuantMoe.Timing*'
timeout 200 "$D/k3_cuda_tests" --gtest_filter="$F" > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED) |cutlass|^\[ (w4a8|mxfp8|mxfp8 tiles) \]|mxfp8 (prefill|decode)|Failure" "$OUT/tests.log" | head -90
xz -9 "$OUT/tests.log"
K3_MOE_TIMING_SHAPES=kl K3_MOE_TIMING_N=256,2048,4096 timeout 100 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing-kl.log" 2>&1
echo "kl timing rc=$? $(el)"; grep "timing \]" "$OUT/moe-timing-kl.log" | cut -c1-170 | head -40
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3"
{ env_ab 2 330 pp4096 tiles "K3_MOE_CUTLASS=0" cutlass "K3_MOE_CUTLASS=1" $KLS
  env_ab 1 300 pp4096-bf16 tiles "K3_MOE_CUTLASS=0" cutlass "K3_MOE_CUTLASS=1" $KLS --gemm-precision bf16
  for v in 0 1; do [ "$(left)" -gt 280 ] || break
    K3_CUDA_PROFILE=1 K3_MOE_CUTLASS=$v timeout 40 "$D/k3" bench offline $KLS > /tmp/p.txt 2>&1
    echo "profile cutlass=$v rc=$? $(el)"; grep -E "moe experts|linear |kda core|mla attn|^\| kimi" /tmp/p.txt
  done; } 2>&1 | tee "$OUT/kl-pp-ab.txt"
timeout 60 $GW/w4a8_bench check > $OUT/w4a8-check.txt 2>&1; echo "w4a8 check rc=$? $(el)"; grep -E "tiled|alayout=3|order|FAIL" $OUT/w4a8-check.txt | head
for n in 1 8 64; do timeout 30 $GW/w4a8_bench time $n 10; echo "w4a8 time n=$n rc=$? $(el)"; done > $OUT/w4a8-time.txt 2>&1
grep -E "^n=|splits=1:|rc=" $OUT/w4a8-time.txt | head -40
for a in float32 mxfp8; do [ "$(left)" -gt 150 ] || break
  timeout 40 $D/k3 perplexity -m models/k3-tiny --device cuda --ctx 512 -f $GW/persuasion-60k.txt --moe-activation-dtype $a > $OUT/ppl-$a.txt 2>&1
  echo "ppl $a rc=$? $(el) $(grep -iE 'ppl|perplexity' $OUT/ppl-$a.txt | tail -2 | tr '\n' ' ')"
done
kl_dummy_args
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 --mem-bw $BW"
for a in float32 mxfp8; do [ "$(left)" -gt 110 ] || break
  timeout 45 $D/k3 bench offline $K3A --moe-activation-dtype $a -p 0 -n 32 -b 1,8,64 -r 2 > /tmp/b.txt 2>&1
  echo "k3s4 decode $a rc=$? $(el)"; grep -E "^\| kimi|rror|numerics" /tmp/b.txt
  timeout 30 $D/k3 bench offline $K3A --moe-activation-dtype $a -p 2048 -n 0 -b 1 -r 2 > /tmp/b.txt 2>&1
  echo "k3s4 pp2048 $a rc=$? $(el)"; grep -E "^\| kimi|rror" /tmp/b.txt
done 2>&1 | tee $OUT/k3s4-act.txt
if [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) > 100 ? 90 : $(left) - 10 )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $D/k3_cuda_tests \
    --gtest_filter='CudaMxfp8.*:CudaMoe.EdgeCases' > $OUT/memcheck.log 2>&1
  echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
fi
if [ "$(left)" -gt 70 ]; then
  K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout $(( $(left) - 10 )) "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing-qat.log" 2>&1
  echo "qat timing rc=$? $(el)"; grep "timing \]" "$OUT/moe-timing-qat.log" | cut -c1-170 | head -24
fi
echo "done $(el)"
