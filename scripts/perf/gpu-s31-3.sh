#!/bin/bash
# session 31 call 3 (issues 15 / 18): the Staged form after the Q6_K shared-load fix (call s31-2: the second word of a
# 2-mod-4 field was read at +2, a misaligned access): tests, memcheck, kernel timing, end to end on llama.cpp's Q4_K_M
# of the Kimi-Linear-dims slice (the committed rule vs K3_QUANT_MMA_FORM=staged vs staged + K3_QUANT_MMA=1).
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 590 - $(date +%s) + T0 )); }
O=$OUT; P=s31-3; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 120 $T --gtest_filter='CudaQuant*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure|staged' $O/$P-tests.log | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.WithinItsBound*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4
timeout 60 $T --gtest_filter='CudaQuantMma.Timing*' > $O/$P-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -E "n= [18] " $O/$P-timing.log | cut -c1-40,100-300
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() {  # label env...
  local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt
}
for r in 1 2; do kb rule-r$r; kb staged-r$r K3_QUANT_MMA_FORM=staged; kb staged-all-r$r K3_QUANT_MMA_FORM=staged K3_QUANT_MMA=1; kb ksplit-all-r$r K3_QUANT_MMA=1; done
cat $O/$P-e2e.txt; echo "k3 e2e $(el)"
