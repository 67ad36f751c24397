#!/bin/bash
# session 35 call 1 (issues 15 / 18). k3 / k3_cuda_tests built on the dev box (scripts/gpu-pack-bins, sm_90) from this
# commit's tree; llama.cpp 0c1e570's source (.gpuwork/llama-cuda-slim.tar.xz, from the llama-cpp-python 0.3.36 sdist,
# which vendors that commit) is NOT carried here (the tree + it went over the 64 MiB cap): the slice is quantised by k3.
# (1) The whole CUDA suite -- first run of session 33's unrun code (quant_gemv_mma_group behind K3_QUANT_MMA_GROUP=1, the
# kernel's empty group parameter on every default launch, run_group_blocks' restructured mma pass) and session 34's
# runner_with test helper; the group tests under K3_QUANT_MMA_GROUP=1, under v3 forced to 8 tokens, and under this
# session's K3_QUANT_GEMV_XS=2 (v3 at two tokens reading x from shared memory); memcheck of the group tests both ways.
# (2) The grouped timing: rule / K3_QUANT_MMA_GROUP=1 / v3 at 2 tokens (mma from 3) with and without XS.
# (3) End to end on k3-q4km.gguf (k3 quantize Q4_K_M, kv_b halves Q5_0 / Q4_K), alternating: rule, K3_QUANT_MMA_GROUP=1, v3:2 + XS, K3_CUDA_LINEAR_GROUP=0.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 580 - $(date +%s) + T0 )); }
O=$OUT; P=s35-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; echo "unpacked $(el)"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
. scripts/perf/lib-gguf-slice.sh
( kl_slice_q4km_k3 $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 200 $T --gtest_filter='-*Timing*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -30; xz -9 $O/$P-all.log
G='CudaLinearGroup.Gguf*:CudaLinearGroup.QuantGemv*:CudaPdl.Grouped*'
tv() { local l=$1 f=$2; shift 2; env "$@" timeout 60 $T --gtest_filter="$f" >> $O/$P-tests.log 2>&1
  echo "tests $l ($*) rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |Failure' $O/$P-tests.log | tail -4; }
tv mmagroup "CudaLinearGroup.*:CudaPdl.*:CudaQuant*:*CudaQuantModel*:-*Timing*" K3_QUANT_MMA_GROUP=1
tv v3x8 "$G" K3_QUANT_GEMV=v3:8 K3_QUANT_MMA=9
tv xs2-kernels "CudaQuantKernels.GemvAndPrefillWithinTheFp32Bound" K3_QUANT_GEMV_XS=2
tv xs2-groups "$G" K3_QUANT_GEMV=v3:2 K3_QUANT_MMA=3 K3_QUANT_GEMV_XS=2
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
mc() { local l=$1; shift; env "$@" timeout 75 $CS --tool memcheck $T --gtest_filter="$G:CudaLinearGroup.Quant*" > $O/$P-memcheck-$l.log 2>&1
  echo "memcheck $l ($*) rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck-$l.log | head -4; xz -9 $O/$P-memcheck-$l.log; }
mc rule; mc mmagroup K3_QUANT_MMA_GROUP=1; mc xs2 K3_QUANT_GEMV=v3:2 K3_QUANT_MMA=3 K3_QUANT_GEMV_XS=2
gt() { local l=$1; shift; echo "## $l ($*)" >> $O/$P-group.txt
  env "$@" timeout 60 $T --gtest_filter='CudaLinearGroupTiming.KimiLinearLayersQ4K' 2>&1 | grep -E "group \]" >> $O/$P-group.txt; }
gt rule; gt mmagroup K3_QUANT_MMA_GROUP=1; gt v3x2-xs K3_QUANT_GEMV=v3:2 K3_QUANT_MMA=3 K3_QUANT_GEMV_XS=2; gt v3x2 K3_QUANT_GEMV=v3:2 K3_QUANT_MMA=3
cat $O/$P-group.txt; echo "timing $(el)"
while [ ! -f /tmp/slice.done ] && [ $(left) -gt 100 ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/k3-q4km.gguf
kb() { local l=$1; shift; [ $(left) -gt 30 ] || return
  env "$@" timeout 50 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2; do kb rule-r$r; kb mmagroup-r$r K3_QUANT_MMA_GROUP=1; kb v3x2xs-r$r K3_QUANT_GEMV=v3:2 K3_QUANT_MMA=3 K3_QUANT_GEMV_XS=2; kb nogroup-r$r K3_CUDA_LINEAR_GROUP=0; done
echo "k3 e2e $(el)"; cat $O/$P-e2e.txt; echo "done $(el)"
