#!/bin/bash
# session 31 call 1 (issues 15 / 18): (1) the quantised suites on the tree with the dense one-tile kernel's registers
# trimmed (84 -> 76: the tile fields compiled out of dense launches) and the Q6_K Rows rule from 8 tokens (both
# unrun on a GPU); (2) the block GEMV's kernel timing (the head's regression: 199 -> 273 us at n = 1 since de34bc7);
# (3) ncu of the one-token kernel on the head and a small Q4_K matrix (what bounds it: DRAM, L1 wavefronts, issue);
# (4) k3 end to end b1 / b8 on llama.cpp's Q4_K_M of the Kimi-Linear-dims slice and a per-kernel split (ncu,
# 2 vs 4 eager steps at depth 64) to say which projections hold batches 1-8 back.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 590 - $(date +%s) + T0 )); }
O=$OUT; P=s31-1; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
. scripts/perf/lib-gguf-slice.sh; llama_quantize_bg
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
( $NVCC -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Isrc scripts/perf/qmma_bench.cu \
    src/k3/backend/cuda/quant_gemv_mma.cu -o /tmp/qb > /tmp/qb-build.log 2>&1; echo "qb rc=$?" > /tmp/qb.done ) &
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( kl_slice_q4km $B > /tmp/slice.log 2>&1; touch /tmp/slice.done ) &
timeout 150 $T --gtest_filter='CudaQuant*:*CudaQuantModel*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure' $O/$P-tests.log | head -20
timeout 60 $T --gtest_filter='CudaQuantMma.Timing*' > $O/$P-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -E "163840 x  2304 n= [18] |7168 n= 1 " $O/$P-timing.log | cut -c1-200
cat /tmp/qb.done; NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for s in "q6_k 163840 2304" "q4_k 2304 4096" "q4_k 4096 7168"; do
  timeout 60 $NCU --clock-control none -k regex:quant_mma_kernel -s 1 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section Occupancy --section WarpStateStats --section SchedulerStats \
    --metrics l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes_read.sum \
    /tmp/qb $s 1 0 1 3 >> $O/$P-ncu-qmma-n1.txt 2>&1; echo "ncu $s rc=$? $(el)"
done
grep -E "qmma |Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|t_requests|t_sectors|dram__bytes" $O/$P-ncu-qmma-n1.txt | head -60
while [ ! -f /tmp/slice.done ]; do sleep 1; done; cat /tmp/slice.log; Q=$BD/ll-q4km.gguf
timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,9 -r 2 --mem-bw -1 > /tmp/kb.txt 2>&1
echo "e2e rc=$? $(el)"; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb.txt | tee $O/$P-e2e.txt
for b in 1 8; do for n in 2 4; do
  [ $(left) -lt 70 ] && break
  timeout 65 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --log-file /tmp/ncu-b$b-n$n.csv \
    $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 64 -b $b -r 1 --mem-bw -1 > /dev/null 2>&1
  echo "ncu b$b n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b$b-n2.csv /tmp/ncu-b$b-n4.csv 4 > $O/$P-ncu-b$b-step.txt 2>&1  # 2 steps x (warm-up + run)
head -25 $O/$P-ncu-b$b-step.txt | cut -c1-170; done
echo "done $(el)"
