#!/bin/bash
# session 33 call 2 (issues 15 / 18): no k3 build on the device -- the binaries come from the dev box (.gpuwork/s33, this
# commit's tree, CUDA 13, sm_90; models/k3-tiny/model.safetensors moved out for the 64 MiB transfer cap, so the
# CudaQuantModel tests are left out) and llama.cpp's CUDA build gets the CPUs, for a same-call comparison. (1) The grouped
# GGUF projections' tests again, plus with v3 forced up to 8 tokens and the tensor cores off (K3_QUANT_GEMV=v3:8
# K3_QUANT_MMA=9: quant_gemv_group at 2..8 tokens); (2) the grouped timing under both; (3) end to end, rule vs
# v3:8 / mma off, batches 1, 2, 4, 8, 16; (4) a per-kernel split of batch-1 and batch-8 steps (ncu); (5) llama.cpp.
# Carry: .gpuwork/s33 .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 585 - $(date +%s) + T0 )); }
O=$OUT; P=s33-2; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
export LD_LIBRARY_PATH=$GW/s33:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
LLAMA_JOBS=14 llama_cuda_bg llama-batched-bench
B=/tmp/k3; T=/tmp/t; xz -dc $GW/s33/k3.xz > $B; xz -dc $GW/s33/k3_cuda_tests.xz > $T; chmod +x $B $T; echo "unpacked $(el)"
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 120 $T --gtest_filter='CudaPdl.*:CudaQuantKernels.*:CudaQuantMma.*:CudaLinearGroup.*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
K3_QUANT_GEMV=v3:8 K3_QUANT_MMA=9 timeout 60 $T --gtest_filter='CudaLinearGroup.Gguf*:CudaLinearGroup.QuantGemv*:CudaPdl.Grouped*' >> $O/$P-tests.log 2>&1
echo "tests v3:8 rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |Failure|repetition' $O/$P-tests.log | head -12
for v in rule v3:8; do echo "## $v" >> $O/$P-group.txt
  ( [ $v = rule ] || export K3_QUANT_GEMV=v3:8 K3_QUANT_MMA=9; timeout 60 $T --gtest_filter='CudaLinearGroupTiming.KimiLinearLayersQ4K' 2>&1 | grep -E "group \]" >> $O/$P-group.txt ); done
cat $O/$P-group.txt; echo "timing $(el)"
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
kb() { local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2; do kb rule-r$r; kb v3x8-r$r K3_QUANT_GEMV=v3:8 K3_QUANT_MMA=9; done; echo "k3 e2e $(el)"; cat $O/$P-e2e.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for b in 1 8; do for n in 2 4; do
  [ $(left) -lt 150 ] && break
  timeout 65 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --log-file /tmp/ncu-b$b-n$n.csv \
    $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 64 -b $b -r 1 --mem-bw -1 > /dev/null 2>&1
  echo "ncu b$b n=$n rc=$? $(el)"
done
[ -f /tmp/ncu-b$b-n4.csv ] && python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b$b-n2.csv /tmp/ncu-b$b-n4.csv 4 > $O/$P-ncu-b$b-step.txt 2>&1
head -22 $O/$P-ncu-b$b-step.txt 2>/dev/null | cut -c1-170; done
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 70 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null || { echo "llama not built $(el)"; tail -3 /tmp/llama-build.log; }
LB=$BD/llama.cpp/b/bin
if [ -x $LB/llama-batched-bench ]; then
  echo "## llama-batched-bench" >> $O/$P-e2e.txt
  timeout 60 $LB/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,2,4,8,16 > /tmp/lbb.txt 2>&1
  echo "llama rc=$? $(el)"; grep -E "^\|" /tmp/lbb.txt >> $O/$P-e2e.txt; grep -m2 -E "build" /tmp/lbb.txt >> $O/$P-e2e.txt
  [ $(left) -gt 25 ] && kb rule-r3; echo "k3 e2e 3 $(el)"
fi
cat $O/$P-e2e.txt; echo "done $(el)"
