#!/bin/bash
# session 38 call 1 (issues 18 and 15): k3 against llama.cpp on the same H200, same GGUF files, one call:
#  (a) the K3-dimension slice (make_k3_slice.py --layers 2 -> `k3 convert`: MXFP4 experts, the rest BF16): the
#      same-card table session 37 measured on an H100 (issue 18);
#  (b) k3's own Q4_K_M of the Kimi-Linear-dims slice (the file s37-1 measured k3 on; llama.cpp reads it), decode at
#      batch 1 / 8 / 16 / 64, k3 with the heads' tiled copy (K3_QUANT_MMA_TILED=1, the default since s37-1), none and
#      all (issue 15's ">= 1.5x llama.cpp CUDA on the same GGUF").
# Call s36-1's rerun on an H200 (session 38) lost `k3 convert` and llama.cpp's build at the same moment: the 22 GB HF dir
# + the 22 GB GGUF + the build on the 64 GiB disk, most likely. So each HF dir is deleted once its GGUF is written, the
# Kimi-Linear slice lives in /dev/shm, and the free disk is printed at each step. k3 read the K3 GGUF and its HF dir at
# the same speed in s36-1 (H100: 429.7 / 431.3 tok/s at batch 1). llama.cpp 0c1e570 from .gpuwork/llama-cuda-slim.tar.xz,
# built with CUDA 90 in the background (16 jobs, ~400-450 s); its runs are ordered by what is most wanted and split so
# that the call's limit cuts only the last.
# Also (added before it ran): the first run of the warpgroup-MMA MoE prefill tiles (commit 4dcd5ca), while the CPU
# writes the checkpoint and llama.cpp builds: tests, timing and a dummy-weight pp4096 A/B.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz .gpuwork/llama-cuda-slim.tar.xz; move
# models/k3-tiny/model.safetensors out of the tree for the call (64 MiB carry cap) and back after.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-588} - $(date +%s) + T0 )); }
O=$OUT; P=s38-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
disk() { echo "disk $1: $(df -BG --output=avail $BD | tail -1 | tr -d ' ') free, shm $(df -BG --output=avail /dev/shm | tail -1 | tr -d ' ') $(el)"; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader; disk start
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz ) ; . scripts/perf/lib-gguf-slice.sh
LLAMA_JOBS=16 llama_cuda_bg llama-bench llama-batched-bench
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model
M=$BD/slice-k3; G=$M.gguf
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; echo "unpacked $(el)"
# (0) the new warpgroup-MMA MoE prefill tiles (tests, timing, e2e; k3-tiny's model is out of the
# tree in this call: its model tests fail to load, the tiny checkpoints' run) on the GPU while the CPU writes the slice.
T=/tmp/k3b/k3_cuda_tests
( export K3_SHARED_DIR=/nonexistent
  timeout 100 stdbuf -oL $T --gtest_filter='CudaMoe.TinyShapes:CudaMoe.EdgeCases:CudaMoe.KimiLinearShape:CudaMoe.K3Shape' > $O/$P-wg-moe-tests.log 2>&1
  echo "wg moe tests rc=$? $(el)" > /tmp/wg.log
  K3_MOE_WGMMA=1 timeout 40 stdbuf -oL $T --gtest_filter='*CudaModelE2E.Prefill*:*CudaModelE2E.Paged*:CudaModelDummy.*' > $O/$P-wg-model-tests.log 2>&1
  echo "wg model tests rc=$? $(el)" >> /tmp/wg.log
  K3_MOE_TIMING_SHAPES=qat,kl timeout 100 stdbuf -oL $T --gtest_filter='CudaMoe.Timing' > $O/$P-wg-moe-timing.log 2>&1
  echo "wg timing rc=$? $(el)" >> /tmp/wg.log; touch /tmp/wg.done ) &
KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_k3_slice.py $M --layers 2 > /tmp/ckpt.log 2>&1
echo "k3 ckpt rc=$? $(el)"; tail -1 /tmp/ckpt.log | cut -c1-160; disk ckpt
$B convert -m $M -o $G > /tmp/convert.log 2>&1; echo "gguf rc=$? $(el)"; tail -2 /tmp/convert.log | cut -c1-200; disk gguf
[ -f $G ] && rm -rf $M; disk "K3 HF dir removed"
( BD=/dev/shm; kl_slice_q4km_k3 $B > /tmp/kl.log 2>&1; rm -rf /dev/shm/slice-kl; touch /tmp/kl.done ) &
while [ ! -f /tmp/wg.done ] && [ $(left) -gt 300 ]; do sleep 1; done; cat /tmp/wg.log
grep -E "^\[  (FAILED|PASSED) |Failure" $O/$P-wg-moe-tests.log | head -12; grep -E "wg-" $O/$P-wg-moe-tests.log | grep -E "n= *(1|64|257) " | head -12
grep -E "^\[  (FAILED|PASSED) |Failure" $O/$P-wg-model-tests.log | head -8
grep -E "n= *(256|2048|4096) .*(tc-|wg-)" $O/$P-wg-moe-timing.log | cut -c1-175
kb() { local name=$1 t=$2; shift 2
  timeout $t $B bench offline -m $G --device cuda --mem-bw -1 "$@" > $O/$P-k3-$name.txt 2>&1
  echo "k3 $name rc=$? $(el)"; grep -E "^\| .*(tg32|pp4096) .*[0-9] \|$" $O/$P-k3-$name.txt; }
kb tg 200 --kv-cache-dtype bf16 -p 0 -n 32 -d 512,8192 -b 1,8,64 -r 3
kb tg256 60 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 256 -r 3
kb pp 40 -p 4096 -n 0 -b 1 -r 2
kb pp-bf16 40 --gemm-precision bf16 -p 4096 -n 0 -b 1 -r 2
W=$O/$P-wg-e2e.txt
pw() { local l=$1 wg=$2; shift 2; [ $(left) -gt 200 ] || return
  K3_MOE_WGMMA=$wg timeout 30 $B bench offline --device cuda --load-format dummy "$@" -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > /tmp/pw.txt 2>&1
  echo "## $l K3_MOE_WGMMA=$wg ($*) rc=$? $(el)" >> $W; grep -E "^\| .*pp4096 .*[0-9] \|$" /tmp/pw.txt >> $W; }
for wg in 0 1; do pw k3 $wg --preset kimi-k3 --num-layers 2; done
for wg in 0 1; do pw k3-bf16 $wg --preset kimi-k3 --num-layers 2 --gemm-precision bf16; done
for wg in 0 1; do pw kl $wg --preset kimi-linear-48b-a3b --num-layers 4; done
cat $W
while [ ! -f /tmp/kl.done ] && [ $(left) -gt 200 ]; do sleep 1; done; tail -12 /tmp/kl.log | cut -c1-200; Q=/dev/shm/k3-q4km.gguf; disk kl
E=$O/$P-kl-e2e.txt
kq() { local l=$1; shift; [ $(left) -gt 40 ] || return
  env "$@" timeout 45 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16,64 -r 2 --mem-bw -1 > /tmp/kq-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$? $(el)" >> $E; grep -E "^\| [^ ]+\.gguf .*tg32 .*[0-9] \|$" /tmp/kq-$l.txt >> $E; }
kq heads-r1 K3_QUANT_MMA_TILED=1; kq none-r1 K3_QUANT_MMA_TILED=0; kq all-r1 K3_QUANT_MMA_TILED=all; cat $E
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 90 ]; do sleep 2; done
cat /tmp/llama.done 2>/dev/null || echo "llama not built $(el)"; tail -3 /tmp/llama-build.log | cut -c1-200; xz -c /tmp/llama-build.log > $O/$P-llama-build.log.xz
LB=$BD/llama.cpp/b/bin
lb() { local name=$1 m=$2; shift 2; [ $(left) -gt 25 ] || return
  timeout $(( $(left) - 15 )) $LB/llama-batched-bench -m $m -ngl 99 -fa 1 -b 2048 -ub 512 -ntg 32 "$@" > $O/$P-llama-$name.txt 2>&1
  echo "llama $name rc=$? $(el)"; grep -E "^\|" $O/$P-llama-$name.txt; }
if [ -x $LB/llama-batched-bench ]; then
  [ -f $Q ] && { lb kl $Q -c 40000 -npp 512 -npl 1,8,16,64; echo "## llama-batched-bench $(el)" >> $E; cat $O/$P-llama-kl.txt >> $E; kq heads-r3 K3_QUANT_MMA_TILED=1; }
  lb k3-b1-8 $G -c 80000 -npp 512,8192 -npl 1,8
  timeout 40 $LB/llama-bench -m $G -ngl 99 -fa 1 -p 4096 -n 0 -r 2 > $O/$P-llama-pp.txt 2>&1; echo "llama pp rc=$? $(el)"; grep -E "^\|" $O/$P-llama-pp.txt | grep -v -- "---"
  lb k3-b64 $G -c 560000 -npp 512,8192 -npl 64
  lb k3-b256 $G -c 150000 -npp 512 -npl 256
fi
. scripts/perf/lib-out.sh; out_bundle $P-k3-tg.txt $P-kl-e2e.txt $P-llama-k3-b1-8.txt $P-llama-pp.txt $P-k3-pp.txt $P-wg-moe-timing.log $P-wg-e2e.txt
echo "done $(el)"
