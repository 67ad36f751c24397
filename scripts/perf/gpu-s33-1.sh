#!/bin/bash
# session 33 call 1 (issues 15 / 18): session 32's unrun changes (the CapturedGraph form of the PDL tests, the 4096-column
# shape of the float64-bound GEMV test, the staged form's limit) and this session's grouped GGUF projections
# (LinearRunner::run_group over block matrices: one v3 launch per format at one token, quant_gemv_group; one prep of x
# for the tensor-core products at 2..64 tokens): tests, memcheck, the grouped-vs-one-by-one timing of a Kimi-Linear
# layer's Q4_K projections, the projection chain (v3 on its new group parameter), end to end on llama.cpp's Q4_K_M of
# the Kimi-Linear-dims slice with grouping on / off (K3_CUDA_LINEAR_GROUP=0) alternating, llama.cpp CUDA in the same call.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 585 - $(date +%s) + T0 )); }
O=$OUT; P=s33-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
llama_cuda_bg llama-batched-bench
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 150 $T --gtest_filter='CudaPdl.*:CudaQuant*:*CudaQuantModel*:CudaLinearGroup.*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |Failure|repetition' $O/$P-tests.log | head -16
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $CS --tool memcheck $T --gtest_filter='CudaLinearGroup.Gguf*:CudaLinearGroup.QuantGemv*:CudaPdl.Grouped*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4; xz -9 $O/$P-memcheck.log
timeout 60 $T --gtest_filter='CudaLinearGroupTiming.KimiLinearLayersQ4K' 2>&1 | grep -E "group \]" > $O/$P-group.txt; cat $O/$P-group.txt
timeout 60 $T --gtest_filter='CudaPdl.TimingChain*' 2>&1 | grep -E "^pdl|per projection" > $O/$P-chain.txt; cat $O/$P-chain.txt; echo "timing $(el)"
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() { local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2; do kb group-r$r; kb nogroup-r$r K3_CUDA_LINEAR_GROUP=0; done; echo "k3 e2e $(el)"
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 100 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null || { echo "llama not built $(el)"; tail -3 /tmp/llama-build.log; }
LB=$BD/llama.cpp/b/bin
if [ -x $LB/llama-batched-bench ]; then
  echo "## llama-batched-bench" >> $O/$P-e2e.txt
  timeout 60 $LB/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,8,16 > /tmp/lbb.txt 2>&1
  echo "llama rc=$? $(el)"; grep -E "^\|" /tmp/lbb.txt >> $O/$P-e2e.txt; grep -m2 -E "build" /tmp/lbb.txt >> $O/$P-e2e.txt
  kb group-r3; kb nogroup-r3 K3_CUDA_LINEAR_GROUP=0; echo "k3 e2e 3 $(el)"
fi
cat $O/$P-e2e.txt; echo "done $(el)"
