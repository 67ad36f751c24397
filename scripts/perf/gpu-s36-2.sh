#!/bin/bash
# session 36 call 2 (issues 15 / 18): the Tiled form of the Q6_K head GEMV (quant_mma_tiled.cuh; a tile-major copy of
# the vocabulary head made at upload) checked and measured end to end. k3 / k3_cuda_tests from the dev box
# (scripts/gpu-pack-bins, this commit); llama.cpp 0c1e570 (.gpuwork/llama-cuda-slim.tar.xz) builds llama-quantize (CPU)
# and llama-batched-bench (CUDA, sm_90) here. models/k3-tiny/model.safetensors moved out for the 64 MiB carry cap.
# (1) CudaQuantMma.* (the new TiledEqualsKSplitAndStaysWithinItsBound), the linear / group / PDL tests; memcheck of the
# Tiled test; (2) end to end on llama-quantize's Q4_K_M of the Kimi-Linear-dims slice, K3_QUANT_MMA_TILED=1 (the head
# tiled) vs the rule (none) vs =all (every K-quant matrix), alternating; (3) llama-batched-bench on the same file, then k3 once more.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz .gpuwork/llama-cuda-slim.tar.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${S36_2_LIMIT:-585} - $(date +%s) + T0 )); }
O=$OUT; P=s36-2; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
LLAMA_JOBS=14 llama_cuda_bg llama-batched-bench
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; echo "unpacked $(el)"
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 150 $T --gtest_filter='CudaQuantMma.*:CudaLinear*:CudaPdl.*:CudaQuantKernels.*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |Failure|tests ran' $O/$P-tests.log | head -12
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.Tiled*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4; xz -9 $O/$P-memcheck.log
while [ ! -f /tmp/slice.done ] && [ $(left) -gt 150 ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() { local l=$1; shift; [ $(left) -gt 40 ] || return
  env "$@" timeout 50 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$? $(el)" >> $O/$P-e2e.txt; grep -E "^\| [^ ]+\.gguf .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2; do kb heads-r$r K3_QUANT_MMA_TILED=1; kb none-r$r K3_QUANT_MMA_TILED=0; kb all-r$r K3_QUANT_MMA_TILED=all; done; echo "k3 e2e $(el)"; cat $O/$P-e2e.txt
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 70 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null || { echo "llama not built $(el)"; tail -3 /tmp/llama-build.log; }
LB=$BD/llama.cpp/b/bin
if [ -x $LB/llama-batched-bench ]; then
  echo "## llama-batched-bench $(el)" >> $O/$P-e2e.txt
  timeout 60 $LB/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,2,4,8,16 > /tmp/lbb.txt 2>&1
  echo "llama rc=$? $(el)"; grep -E "^\|" /tmp/lbb.txt >> $O/$P-e2e.txt
  kb heads-r3 K3_QUANT_MMA_TILED=1; kb none-r3 K3_QUANT_MMA_TILED=0; echo "k3 e2e 3 $(el)"
fi
cat $O/$P-e2e.txt; echo "done $(el)"
