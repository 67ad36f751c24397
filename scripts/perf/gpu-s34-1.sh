#!/bin/bash
# session 34 call 1 -- NOT RUN (no device was lent in session 34; written for the next session that has one).
# Needs no llama.cpp (its source could not be fetched in session 34) and no device build: k3 / k3_cuda_tests built on the
# dev box by scripts/gpu-pack-bins from this commit's tree (.gpuwork/k3bins.tar.xz, ~7 MB) -- the tracked tree (55.3 MB)
# plus that and the tokenizer stay under the 64 MiB transfer cap.
# (1) The whole CUDA suite (first run of session 33's unrun GPU code: quant_gemv_mma_group behind K3_QUANT_MMA_GROUP=1, the
# quant_mma kernel's empty group parameter on every default launch, run_group_blocks' restructured mma pass), the group
# tests again with the one-token v3 forced to 8 tokens, memcheck on the group tests; (2) the grouped timing
# (KimiLinearLayersQ4K: rule / one launch per format / ungrouped); (3) end to end on the Kimi-Linear-dims slice quantised by
# k3 (Q4_K_M, kv_b halves Q5_0 / Q4_K), alternating: the rule, K3_QUANT_MMA_GROUP=1, K3_CUDA_LINEAR_GROUP=0; (4) the CPU
# on the host's 16 cores: session 34's MLA over the stored halves against the fp32 copy (K3_MLA_STORED_HALVES=0), op
# profile. If K3_QUANT_MMA_GROUP=1 wins (3), make it the default (linear.cu mma_grouped_).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s34-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; echo "unpacked $(el)"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
. scripts/perf/lib-gguf-slice.sh
( kl_slice_q4km_k3 $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 200 $T --gtest_filter='-*Timing*' > $O/$P-all.log 2>&1; echo "all rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|SKIPPED \]' $O/$P-all.log | head -30; xz -9 $O/$P-all.log
K3_QUANT_MMA_GROUP=1 timeout 60 $T --gtest_filter='CudaLinearGroup.*:CudaPdl.*:CudaQuant*:*CudaQuantModel*:-*Timing*' > $O/$P-tests-mmagroup.log 2>&1
echo "tests K3_QUANT_MMA_GROUP=1 rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |Failure' $O/$P-tests-mmagroup.log | head -6
K3_QUANT_GEMV=v3:8 K3_QUANT_MMA=9 timeout 60 $T --gtest_filter='CudaLinearGroup.Gguf*:CudaLinearGroup.QuantGemv*:CudaPdl.Grouped*' > $O/$P-tests-v3x8.log 2>&1
echo "tests v3:8 rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) |Failure' $O/$P-tests-v3x8.log | head -6
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in 0 1; do
  K3_QUANT_MMA_GROUP=$v timeout 90 $CS --tool memcheck $T --gtest_filter='CudaLinearGroup.Gguf*:CudaLinearGroup.Quant*:CudaPdl.Grouped*' > $O/$P-memcheck-$v.log 2>&1
  echo "memcheck K3_QUANT_MMA_GROUP=$v rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/$P-memcheck-$v.log | head -4; xz -9 $O/$P-memcheck-$v.log
done
timeout 60 $T --gtest_filter='CudaLinearGroupTiming.KimiLinearLayersQ4K' 2>&1 | grep -E "group \]" > $O/$P-group.txt; cat $O/$P-group.txt; echo "timing $(el)"
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/k3-q4km.gguf
kb() { local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt; }
for r in 1 2; do kb rule-r$r; kb mmagroup-r$r K3_QUANT_MMA_GROUP=1; kb nogroup-r$r K3_CUDA_LINEAR_GROUP=0; done; echo "k3 e2e $(el)"; cat $O/$P-e2e.txt
for v in 0 1; do
  K3_MLA_STORED_HALVES=$v K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=10 timeout 90 $B bench offline -m $Q -p 0 -n 16 -b 1,8 -r 1 -t 16 --no-mmap > /tmp/cpu-$v.txt 2>&1
  echo "## CPU 16 threads K3_MLA_STORED_HALVES=$v rc=$?" >> $O/$P-cpu.txt; grep -E "tg16 \||mla_absorbed|moe_experts n|weights streamed|memory read" /tmp/cpu-$v.txt >> $O/$P-cpu.txt
done; cat $O/$P-cpu.txt
echo "done $(el)"
