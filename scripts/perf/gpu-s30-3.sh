#!/bin/bash
# session 30 call 3 (issues 15 / 18): the final rule of the dense tensor-core block GEMV's two forms (Rows for Q6_K
# from 9 tokens, Q4_K from 17; KSplit otherwise) on the H200: the quantised suites through LinearRunner's rule, then
# the same-call table on llama.cpp's own Q4_K_M of the Kimi-Linear-dims 4-layer slice: k3 (default precision, 2
# rounds; --gemm-precision bf16), llama.cpp CUDA (batched-bench b1..64 at depth 512, llama-bench tg64), and a
# per-kernel split of k3's batch-8 step (ncu, 5-step minus 2-step eager runs: scripts/perf/ncu_step_diff.py).
# llama-quantize comes from a CPU-only build (fast) so that the file exists while the CUDA build runs.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 595 - $(date +%s) + T0 )); }
O=$OUT; P=s30-3; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz && cd llama.cpp &&
  cmake -S . -B bq -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llamaq-cfg.log 2>&1 &&
  cmake --build bq -j6 --target llama-quantize > /tmp/llamaq-build.log 2>&1; echo "llama-quantize build rc=$? $(el)" > /tmp/llamaq.done ) &
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model; M=$BD/slice-kl; G=$M.gguf
( KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_kl_slice.py $M > /tmp/ckpt.log 2>&1 &&
  $B convert -m $M -o $G > /tmp/convert.log 2>&1; echo "ckpt+gguf rc=$? $(el)" > /tmp/gguf.done ) &
timeout 150 $T --gtest_filter='CudaQuant*:*CudaQuantModel*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure' $O/$P-tests.log | head -20
while [ ! -f /tmp/llamaq.done ] || [ ! -f /tmp/gguf.done ]; do sleep 1; done; cat /tmp/llamaq.done /tmp/gguf.done
LBIN=$BD/llama.cpp/b/bin; Q=$BD/ll-q4km.gguf
( cd $BD/llama.cpp && cmake -S . -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  cmake --build b -j12 --target llama-bench llama-batched-bench > /tmp/llama-build.log 2>&1
  echo "llama build rc=$? $(el)" > /tmp/llama.done ) &
timeout 100 $BD/llama.cpp/bq/bin/llama-quantize $G $Q Q4_K_M 16 > /tmp/llama-quantize.log 2>&1; echo "llama-quantize rc=$? $(el)"
grep -E "quant size" /tmp/llama-quantize.log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 5; do
  timeout 90 $NCU --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --log-file /tmp/ncu-b8-n$n.csv \
    $B bench offline -m $Q --device cuda --enforce-eager --kv-cache-dtype bf16 -p 0 -n $n -d 512 -b 8 -r 1 --mem-bw -1 > /dev/null 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-b8-n2.csv /tmp/ncu-b8-n5.csv 3 > $O/$P-ncu-b8-step.txt 2>&1; head -30 $O/$P-ncu-b8-step.txt | cut -c1-160
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 120 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null
kb() {  # label env...
  local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16,32,64 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt
}
kb rule-r1; kb rule-r2
echo "## k3 --gemm-precision bf16" >> $O/$P-e2e.txt
timeout 60 $B bench offline -m $Q --device cuda --gemm-precision bf16 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16,32,64 -r 2 --mem-bw -1 2>&1 | grep -E "^\| .*tg32 .*[0-9] \|$" >> $O/$P-e2e.txt
echo "k3 e2e $(el)"
[ -x $LBIN/llama-batched-bench ] && [ $(left) -gt 45 ] && { echo "## llama-batched-bench" >> $O/$P-e2e.txt; timeout $(( $(left) - 25 )) $LBIN/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 40000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,8,16,32,64 2>&1 | grep -E "^\|" >> $O/$P-e2e.txt; }
[ -x $LBIN/llama-bench ] && [ $(left) -gt 15 ] && { echo "## llama-bench" >> $O/$P-e2e.txt; timeout $(( $(left) - 5 )) $LBIN/llama-bench -m $Q -ngl 99 -fa 1 -p 0 -n 64 -r 3 2>&1 | grep -E "^\|" | grep -v -- "---" >> $O/$P-e2e.txt; }
cat $O/$P-e2e.txt
echo "done $(el)"
