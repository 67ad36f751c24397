#!/bin/bash
# session 30 call 2 (issues 15 / 18): the Rows form of the dense tensor-core block GEMV (quant_mma_rows.cuh: 8 warps on
# 128 different rows, x staged in shared memory once per block, k slices into partials for short matrices). k3 builds
# here (all cores), then, while llama.cpp builds (12 cores), the quantised suites (CudaQuant*: the Rows form against
# the float64 bound, with and without k slices), a memcheck of the Rows form, its timing beside the KSplit form; then
# the Kimi-Linear-dims 4-layer slice (scripts/peer/make_kl_slice.py), llama.cpp's own `llama-quantize Q4_K_M` of it
# (the s29-4 file: seeded writer, deterministic quantiser), k3 with K3_QUANT_MMA_FORM=rows (every batch) against the
# default (KSplit: session 29's kernel), and llama.cpp (batched-bench b1 / 8 / 64 at depth 512), same call.
# Carry: .gpuwork/deps.tar.xz .gpuwork/llama-cuda-slim.tar.xz .gpuwork/tiktoken.model.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 595 - $(date +%s) + T0 )); }
O=$OUT; P=s30-2; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin k3_cuda_tests" . scripts/gpu-build; echo "k3 built $(el)"
B=$ROOT/build/cuda/k3; T=$ROOT/build/cuda/k3_cuda_tests
[ -x $T ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
LBIN=$BD/llama.cpp/b/bin
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz && cd llama.cpp &&
  cmake -S . -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  cmake --build b -j12 --target llama-bench llama-batched-bench llama-quantize > /tmp/llama-build.log 2>&1
  echo "llama build rc=$? $(el)" > /tmp/llama.done ) &
timeout 150 $T --gtest_filter='CudaQuant*:*CudaQuantModel*:-*Timing*' > $O/$P-tests.log 2>&1; echo "tests rc=$? $(el)"
grep -E '^\[  (FAILED|PASSED) |tests ran|Failure|rows' $O/$P-tests.log | head -30
timeout 90 $T --gtest_filter='CudaQuantMma.Timing*' > $O/$P-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -E "quant mma" $O/$P-timing.log | cut -c13-60,95-300
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 $CS --tool memcheck $T --gtest_filter='CudaQuantMma.WithinItsBound*' > /tmp/memcheck.log 2>&1; echo "memcheck rc=$? $(el)"
grep -E "ERROR SUMMARY|PASSED|FAILED" /tmp/memcheck.log | head -3; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid" /tmp/memcheck.log | head -8 >> $O/$P-tests.log
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model; M=$BD/slice-kl; G=$M.gguf
KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_kl_slice.py $M > /tmp/ckpt.log 2>&1; echo "ckpt rc=$? $(el)"
$B convert -m $M -o $G > /tmp/convert.log 2>&1; echo "gguf rc=$? $(el)"
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 150 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null
Q=$BD/ll-q4km.gguf
timeout 120 $LBIN/llama-quantize $G $Q Q4_K_M 16 > /tmp/llama-quantize.log 2>&1; echo "llama-quantize rc=$? $(el)"
grep -E "quant size" /tmp/llama-quantize.log
kb() {  # label env...
  local l=$1; shift
  env "$@" timeout 60 $B bench offline -m $Q --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,16,32,64 -r 2 --mem-bw -1 > /tmp/kb-$l.txt 2>&1
  echo "## k3 $l ($*) rc=$?" >> $O/$P-e2e.txt; grep -E "^\| .*tg32 .*[0-9] \|$" /tmp/kb-$l.txt >> $O/$P-e2e.txt
}
for r in 1 2; do kb rows-r$r K3_QUANT_MMA_FORM=rows; kb ksplit-r$r; done
echo "## k3 rows --gemm-precision bf16" >> $O/$P-e2e.txt
K3_QUANT_MMA_FORM=rows timeout 60 $B bench offline -m $Q --device cuda --gemm-precision bf16 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,64 -r 2 --mem-bw -1 2>&1 | grep -E "^\| .*tg32 .*[0-9] \|$" >> $O/$P-e2e.txt
echo "k3 e2e $(el)"; cat $O/$P-e2e.txt
[ $(left) -gt 50 ] && { echo "## llama-batched-bench" >> $O/$P-e2e.txt; timeout $(( $(left) - 20 )) $LBIN/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 40000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,8,16,32,64 2>&1 | grep -E "^\|" >> $O/$P-e2e.txt; }
tail -12 $O/$P-e2e.txt
echo "done $(el)"
