#!/bin/bash
# session 31 call 4 (issues 15 / 18): the rule with the Staged form for 2..8 tokens below the tall heads (after the
# per-stage Q6_K offset fix): quantised suites (float64 bound, bitwise = KSplit, CPU vs CUDA logits), memcheck, end to
# end on llama.cpp's Q4_K_M of the Kimi-Linear-dims slice (new rule vs K3_QUANT_MMA_STAGED=0, alternating), the b8
# per-kernel split, and the whole CUDA binary outside timing.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 470 - $(date +%s) + T0 )); }
O=$OUT; P=s31-4; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 120 $T --gtest_filter='CudaQuant*:*CudaQuantModel*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure|staged' $O/$P-tests.log | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.WithinItsBound*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4; xz -9 $O/$P-memcheck.log
timeout 30 $T --gtest_filter='CudaQuantMma.Timing*' > $O/$P-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -E "n= [18] " $O/$P-timing.log | cut -c1-40,100-300
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() {  # label env...
  local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt
}
for r in 1 2; do kb rule-r$r; kb unstaged-r$r K3_QUANT_MMA_STAGED=0; done
cat $O/$P-e2e.txt; echo "k3 e2e $(el)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do
  timeout 45 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --log-file /tmp/ncu-b8-n$n.csv $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 64 -b 8 -r 1 --mem-bw -1 > /dev/null 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b8-n2.csv /tmp/ncu-b8-n4.csv 4 > $O/$P-ncu-b8-step.txt 2>&1; head -12 $O/$P-ncu-b8-step.txt | cut -c1-150
[ $(left) -gt 40 ] && { timeout $(( $(left) - 10 )) $T --gtest_filter='-*Timing*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
  grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -12; xz -9 $O/$P-all.log; }
echo "done $(el)"
