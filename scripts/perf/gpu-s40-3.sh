#!/bin/bash
# session 40 call 3 (issue 15): the GPU batch-1 figure on the same GGUF, quiet, one call, on an H200 if given (s39-5 ran on an H100):
# Q4_K_M of the Kimi-Linear-dims slice, `llama-bench -n 128` (tg at batch 1, llama.cpp's own tool; session 38 had only
# llama-batched-bench's first cell) and `k3 bench offline` batch 1 / 8, alternating, after llama.cpp's build and k3's
# quantisation are done (s38-1's k3 rows ran beside them); (b) while those build, the chunked KDA kernel at steep decays
# (CudaKda.ChunkedSteepDecaysMatchCpuRecurrence, new) and the KDA-only model test.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz .gpuwork/llama-cuda-slim.tar.xz; move
# models/k3-tiny/model.safetensors out of the tree for the call (64 MiB carry cap) and back after.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-585} - $(date +%s) + T0 )); }
O=$OUT; P=s40-3; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD /tmp/k3b
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz ) ; . scripts/perf/lib-gguf-slice.sh
LLAMA_JOBS=12 llama_cuda_bg llama-bench
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests
( BD=/dev/shm; kl_slice_q4km_k3 $B > /tmp/kl.log 2>&1; rm -rf /dev/shm/slice-kl; touch /tmp/kl.done ) &
K3_SHARED_DIR=/nonexistent timeout 300 stdbuf -oL $T --gtest_filter='-*Timing*' > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure" $O/$P-suite.log | head; xz -9 $O/$P-suite.log
while { [ ! -f /tmp/kl.done ] || [ ! -f /tmp/llama.done ]; } && [ $(left) -gt 120 ]; do sleep 2; done
tail -4 /tmp/kl.log | cut -c1-200; cat /tmp/llama.done 2>/dev/null || echo "llama not built $(el)"; tail -2 /tmp/llama-build.log | cut -c1-200
Q=/dev/shm/k3-q4km.gguf; LB=$BD/llama.cpp/b/bin; E=$O/$P-b1.txt
for r in 1 2; do
  [ $(left) -gt 50 ] && [ -f $Q ] && { timeout 45 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 128 -d 0 -b 1,8 -r 3 --mem-bw -1 > /tmp/k3b1.txt 2>&1
    echo "## k3 round $r rc=$? $(el)" >> $E; grep -E "^\| [^ ]+\.gguf .*tg128 .*[0-9] \|$" /tmp/k3b1.txt >> $E; }
  [ $(left) -gt 40 ] && [ -x $LB/llama-bench ] && { timeout 35 $LB/llama-bench -m $Q -ngl 99 -fa 1 -p 0 -n 128 -r 3 > /tmp/lb.txt 2>&1
    echo "## llama-bench round $r rc=$? $(el)" >> $E; grep -E "^\|" /tmp/lb.txt >> $E; }
done
cat $E; echo "done $(el)"
