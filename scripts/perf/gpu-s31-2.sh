#!/bin/bash
# session 31 call 2 (issues 15 / 18): the Staged form of the block GEMV (weights through shared memory by coalesced
# cp.async; quant_mma_staged.cuh): its tests (float64 bound, bitwise = KSplit mt 1), memcheck, kernel timing, and end
# to end on llama.cpp's Q4_K_M of the Kimi-Linear-dims slice: the rule as committed vs K3_QUANT_MMA_FORM=staged (n <= 8)
# vs staged + K3_QUANT_MMA=1 (the tensor cores for one token on every matrix), llama.cpp CUDA in the same call.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 590 - $(date +%s) + T0 )); }
O=$OUT; P=s31-2; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( while [ ! -f /tmp/llamaq.done ]; do sleep 1; done; cd $BD/llama.cpp &&
  cmake -S . -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  cmake --build b -j12 --target llama-batched-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$? $(el)" > /tmp/llama.done ) &
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 120 $T --gtest_filter='CudaQuant*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure|staged' $O/$P-tests.log | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.WithinItsBound*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4
timeout 60 $T --gtest_filter='CudaQuantMma.Timing*' > $O/$P-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -E "n= [18] " $O/$P-timing.log | cut -c1-100,150-260
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() {  # label env...
  local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt
}
for r in 1 2; do kb rule-r$r; kb staged-r$r K3_QUANT_MMA_FORM=staged; kb staged-all-r$r K3_QUANT_MMA_FORM=staged K3_QUANT_MMA=1; done
cat $O/$P-e2e.txt; echo "k3 e2e $(el)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do
  K3_QUANT_MMA_FORM=staged K3_QUANT_MMA=1 timeout 60 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --log-file /tmp/ncu-b1-n$n.csv $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 64 -b 1 -r 1 --mem-bw -1 > /dev/null 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b1-n2.csv /tmp/ncu-b1-n4.csv 4 > $O/$P-ncu-b1-staged-all.txt 2>&1; head -14 $O/$P-ncu-b1-staged-all.txt | cut -c1-150
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 60 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null
LBIN=$BD/llama.cpp/b/bin
[ -x $LBIN/llama-batched-bench ] && [ $(left) -gt 30 ] && { echo "## llama-batched-bench" >> $O/$P-e2e.txt; timeout $(( $(left) - 10 )) $LBIN/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,8,16 2>&1 | grep -E "^\|" >> $O/$P-e2e.txt; }
tail -8 $O/$P-e2e.txt; echo "done $(el)"
