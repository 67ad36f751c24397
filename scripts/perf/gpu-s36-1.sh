#!/bin/bash
# session 36 call 1 (issue 18): the K3-dimension slice against llama.cpp in ONE call again (last same-call table:
# session 16; every decode kernel change since -- the ring MXFP4 decode kernel, PDL, the MLA split merge -- is in
# k3's column now). scripts/gpu-peer-slice k3's recipe with carried binaries (scripts/gpu-pack-bins, this commit) and
# llama.cpp 0c1e570 from .gpuwork/llama-cuda-slim.tar.xz (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp),
# built with CUDA 90 in the background. While the 2-layer checkpoint is written (numpy, ~160 s), a per-kernel split of
# a K3-width batch-8 decode step (dummy 2-layer slice, ncu 5-step minus 2-step). Then k3 on the HF dir (decode batch
# 1 / 8 / 64 x depth 512 / 8192, batch 256 at 512, pp4096 at both GEMM precisions), llama.cpp on the GGUF
# (`k3 convert` of the same dir), and k3 once more at batch 1 / 8 on that GGUF (the same bytes both engines read).
# models/k3-tiny/model.safetensors is moved out of the tree for the call (64 MiB carry cap).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/q6k_tiled_bench.xz
# Prep on the dev box (a fresh checkout has no .gpuwork): scripts/gpu-pack-bins; the bench with the nvcc line in
# scripts/perf/q6k_tiled_bench.cu's header, then xz -9; xz -9 of the shared tiktoken.model; llama-cuda-slim.tar.xz as
# session 35's note says (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, trimmed); move
# models/k3-tiny/model.safetensors out of the tree for the call (64 MiB carry cap) and back after.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 588 - $(date +%s) + T0 )); }
O=$OUT; P=s36-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz ) ; . scripts/perf/lib-gguf-slice.sh
LLAMA_JOBS=12 llama_cuda_bg llama-bench llama-batched-bench
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model
M=$BD/slice-k3; G=$M.gguf
( KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_k3_slice.py $M --layers 2 > /tmp/ckpt.log 2>&1
  echo "ckpt rc=$? $(el)" >> /tmp/ckpt.log; touch /tmp/ckpt.done ) &
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; echo "unpacked $(el)"
# (00) the Tiled form's test (this commit's k3_cuda_tests; the form is wired in for Q6_K vocabulary heads; Q4_K / Q5_K
# copies with K3_QUANT_MMA_TILED=all)
timeout 60 /tmp/k3b/k3_cuda_tests --gtest_filter='CudaQuantMma.Tiled*:CudaQuantMma.Refuses*:CudaLinearGroup.Tiled*:CudaLinearGroup.QuantMmaGroup*' > $O/$P-tiled-tests.log 2>&1; echo "tiled tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |Failure' $O/$P-tiled-tests.log | head -8
# (0) the Tiled GEMV (quant_mma_tiled.cuh, scripts/perf/q6k_tiled_bench.cu built on the dev box) against KSplit, the
# rule and the fp32 GEMV: the Kimi-Linear head, K3's head, Kimi-Linear / K3 projection shapes in Q4_K / Q5_K / Q6_K
xz -dc $GW/q6k_tiled_bench.xz > /tmp/q6kb && chmod +x /tmp/q6kb
for a in "q6_k 163840 2304 1" "q6_k 163840 2304 2" "q6_k 163840 2304 8" "q6_k 163840 2304 16" "q6_k 163840 2304 1 0" "q6_k 163840 7168 1" "q6_k 4096 7168 1" "q4_k 4096 2304 1" "q4_k 4096 2304 2" "q4_k 4096 2304 8" "q4_k 2304 4096 1" "q4_k 4096 7168 1" "q4_k 4096 7168 4" "q5_k 4096 7168 1"; do
  timeout 40 /tmp/q6kb $a >> $O/$P-q6k-tiled.txt 2>&1; done; cat $O/$P-q6k-tiled.txt; echo "q6k bench $(el)"
# (1) batch-8 step split on the dummy slice while the checkpoint is written
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 5; do
  timeout 70 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --log-file /tmp/ncu-b8-n$n.csv $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 2 \
    --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 64 -b 8 -r 1 --mem-bw -1 > $O/$P-ncu-run-$n.txt 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b8-n2.csv /tmp/ncu-b8-n5.csv 3 > $O/$P-ncu-k3-b8-step.txt 2>&1
head -24 $O/$P-ncu-k3-b8-step.txt | cut -c1-160
while [ ! -f /tmp/ckpt.done ] && [ $(left) -gt 300 ]; do sleep 1; done; tail -2 /tmp/ckpt.log
( $B convert -m $M -o $G > /tmp/convert.log 2>&1; echo "gguf rc=$? $(el)" >> /tmp/convert.log; touch /tmp/convert.done ) &
# (2) k3 on the HF dir
kb() { local name=$1 t=$2; shift 2
  timeout $t $B bench offline -m $M --device cuda --mem-bw -1 "$@" > $O/$P-k3-$name.txt 2>&1
  echo "k3 $name rc=$? $(el)"; grep -E "^\| .*(tg32|pp4096) .*[0-9] \|$" $O/$P-k3-$name.txt; }
kb tg 200 --kv-cache-dtype bf16 -p 0 -n 32 -d 512,8192 -b 1,8,64 -r 3
kb tg256 60 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 256 -r 3
kb pp 40 -p 4096 -n 0 -b 1 -r 2
kb pp-bf16 40 --gemm-precision bf16 -p 4096 -n 0 -b 1 -r 2
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 120 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null || { echo "llama not built $(el)"; tail -3 /tmp/llama-build.log; }
while [ ! -f /tmp/convert.done ] && [ $(left) -gt 100 ]; do sleep 1; done; tail -1 /tmp/convert.log | cut -c1-160
LB=$BD/llama.cpp/b/bin
if [ -x $LB/llama-batched-bench ] && [ -f $G ]; then
  timeout 40 $LB/llama-bench -m $G -ngl 99 -fa 1 -p 4096 -n 0 -r 2 > $O/$P-llama-pp.txt 2>&1; echo "llama pp rc=$? $(el)"; grep -E "^\|" $O/$P-llama-pp.txt | grep -v -- "---"
  timeout $(( $(left) - 75 )) $LB/llama-batched-bench -m $G -ngl 99 -fa 1 -c 560000 -b 2048 -ub 512 -npp 512,8192 -ntg 32 -npl 1,8,64 > $O/$P-llama-batched.txt 2>&1
  echo "llama batched rc=$? $(el)"; grep -E "^\|" $O/$P-llama-batched.txt
  [ $(left) -gt 45 ] && { timeout $(( $(left) - 40 )) $LB/llama-batched-bench -m $G -ngl 99 -fa 1 -c 150000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 256 > $O/$P-llama-batched256.txt 2>&1; echo "llama 256 rc=$? $(el)"; grep -E "^\|" $O/$P-llama-batched256.txt; }
fi
# (3) k3 on the GGUF llama.cpp read
[ -f $G ] && [ $(left) -gt 30 ] && { timeout $(( $(left) - 5 )) $B bench offline -m $G --device cuda --mem-bw -1 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8 -r 2 > $O/$P-k3-gguf.txt 2>&1; echo "k3 gguf rc=$? $(el)"; grep -E "^\| .*tg32 .*[0-9] \|$" $O/$P-k3-gguf.txt; }
. scripts/perf/lib-out.sh; out_bundle $P-tiled-tests.log $P-q6k-tiled.txt $P-ncu-k3-b8-step.txt $P-k3-tg.txt $P-llama-batched.txt $P-k3-pp.txt $P-llama-pp.txt
echo "done $(el)"
