#!/bin/bash
# session 37 call 1 (issues 15 / 18): session 36-2 without llama.cpp's CUDA build (it took 468 s of call s36-1; the
# device is scarce): the Tiled form's gtests (s36-1's summary line was lost; CudaQuantModelTiled new) + memcheck, then
# k3's Q4_K_M of the Kimi-Linear-dims slice end to end with the heads' tiled copy (K3_QUANT_MMA_TILED=1) vs none vs all,
# alternating, as far as LIMIT allows (the tests first). Binaries: scripts/gpu-pack-bins of this
# commit. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz (k3-tiny stays in the tree: the quantised-model
# tests read it; so no room for llama.cpp's source: the slice is quantised by k3's own Q4_K_M). LIMIT=seconds (default 585).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }
O=$OUT; P=s37-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader
. scripts/perf/lib-gguf-slice.sh
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; echo "unpacked $(el)"
( kl_slice_q4km_k3 $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
TT=$(left); TT=$(( TT > 160 ? 150 : TT - 10 )); timeout $TT $T --gtest_filter='CudaQuantModelTiled.*:CudaQuantMma.*:CudaLinear*:CudaPdl.*:CudaQuantKernels.*:*CudaQuantModel.*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED) |Failure|tests ran|tiled e2e|quant e2e" $O/$P-tests.log | head -24
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ $(left) -gt 70 ] && timeout 60 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.Tiled*:CudaLinearGroup.Tiled*' > $O/$P-memcheck.log 2>&1
echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck.log | head -4; xz -9 $O/$P-memcheck.log
while [ ! -f /tmp/slice.done ] && [ $(left) -gt 100 ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/k3-q4km.gguf
kb() { local l=$1; shift; [ $(left) -gt 35 ] || return
  env "$@" timeout 45 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$? $(el)" >> $O/$P-e2e.txt; grep -E "^\| [^ ]+\.gguf .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2 3; do kb heads-r$r K3_QUANT_MMA_TILED=1; kb none-r$r K3_QUANT_MMA_TILED=0; kb all-r$r K3_QUANT_MMA_TILED=all; done
cat $O/$P-e2e.txt; echo "done $(el)"
