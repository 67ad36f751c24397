#!/bin/bash
# session 32 call 2 (issues 15 / 18; call s32-1 failed to build: a test file written while it was sent). (1) Session
# 31's unrun block-GEMV changes and this session's programmatic dependent launch (src/k3/backend/cuda/pdl.cuh: the GGUF
# block GEMVs request their weights into L2 before griddepcontrol.wait, every decode kernel lets them start): the
# ordering test (CudaPdl: a predecessor writes x ~100 us late, eager and in a graph; also with K3_PDL=0), the quantised
# suites, memcheck, the whole CUDA binary. (2) End to end on llama.cpp's Q4_K_M of the Kimi-Linear-dims slice, K3_PDL=1
# vs 0 alternating, and llama.cpp CUDA built in this call (its binaries brought back for later calls).
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 585 - $(date +%s) + T0 )); }
O=$OUT; P=s32-2; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
llama_cuda_bg llama-batched-bench llama-bench
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 150 $T --gtest_filter='CudaPdl.*:CudaQuant*:*CudaQuantModel*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure|repetition' $O/$P-tests.log | head -16
K3_PDL=0 timeout 30 $T --gtest_filter='CudaPdl.*' > /tmp/pdl0.log 2>&1; echo "CudaPdl with K3_PDL=0 rc=$? $(el)"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $CS --tool memcheck $T --gtest_filter='CudaPdl.*:CudaQuantMma.*:-*Timing*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -6; xz -9 $O/$P-memcheck.log
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() { local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2; do kb pdl-r$r; kb nopdl-r$r K3_PDL=0; done; echo "k3 e2e $(el)"
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 130 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null || { echo "llama not built $(el)"; tail -3 /tmp/llama-build.log; }
LB=$BD/llama.cpp/b/bin
if [ -x $LB/llama-batched-bench ]; then
  mkdir -p /tmp/lb && cp -a $LB/llama-bench $LB/llama-batched-bench $LB/*.so* /tmp/lb/ && strip /tmp/lb/* 2>/dev/null
  ( cd /tmp && tar -cJf $O/llama-cuda-bin.tar.xz lb ) & TP=$!
  echo "## llama-batched-bench" >> $O/$P-e2e.txt
  timeout 100 $LB/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,8,16 > /tmp/lbb.txt 2>&1
  echo "llama rc=$? $(el)"; grep -E "^\|" /tmp/lbb.txt >> $O/$P-e2e.txt; grep -m2 -E "build" /tmp/lbb.txt >> $O/$P-e2e.txt
  kb pdl-r3; kb nopdl-r3 K3_PDL=0; echo "k3 e2e 3 $(el)"; wait $TP; ls -la $O/llama-cuda-bin.tar.xz
fi
cat $O/$P-e2e.txt
[ $(left) -gt 50 ] && { timeout $(( $(left) - 10 )) $T --gtest_filter='-*Timing*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
  grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -12; xz -9 $O/$P-all.log; }
echo "done $(el)"
