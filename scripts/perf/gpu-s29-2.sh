#!/bin/bash
# session 29 call 2 (issue 15's H200 measure, issue 18's batched decode): GGUF decode with the tensor-core block GEMV
# (quant_gemv_mma.cu) against the fp32 block GEMV it replaces (K3_QUANT_MMA=off, same binary) and against llama.cpp's
# CUDA backend on llama.cpp's OWN Q4_K_M of the same weights, same call: the Kimi-Linear-dims 4-layer slice
# (scripts/peer/make_kl_slice.py, seed fixed: the session-19 bytes), `k3 convert` to BF16, `llama-quantize Q4_K_M`.
# While llama.cpp builds (14 cores): k3's own Q4_K_M (experts to Q4_K by --tensor-type) and the A/B on it (alternating;
# the build loads the host, so only the same-minutes ratio means something). After the build, quiet: k3 new / old and
# llama.cpp (batched-bench b1 / 8 / 64 at depth 512, llama-bench pp512 / tg64) on llama.cpp's file.
# Carry: .gpuwork/deps.tar.xz (k3 builds here first, all cores: the prebuilt binary does not fit the 64 MiB carry beside
# the rest), .gpuwork/llama-cuda-slim.tar.xz (llama.cpp 0c1e570's source without the other backends, tools cut to
# batched-bench / llama-bench / quantize), .gpuwork/tiktoken.model.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 595 - $(date +%s) + T0 )); }
O=$OUT; P=s29-2; GW=$ROOT/.gpuwork; BD=/tmp/w; mkdir -p $BD
LBIN=$BD/llama.cpp/b/bin
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS="k3bin" . scripts/gpu-build; echo "k3 built $(el)"
[ -x build/cuda/k3 ] || { tail -30 /tmp/build.log > $O/$P-build-tail.log; exit 1; }
( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz && cd llama.cpp &&
  cmake -S . -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > $O/$P-llama-cfg.log 2>&1 &&
  cmake --build b -j14 --target llama-bench llama-batched-bench llama-quantize > /tmp/llama-build.log 2>&1
  echo "llama build rc=$? $(el)" > /tmp/llama.done ) &
xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model
B=$ROOT/build/cuda/k3; M=$BD/slice-kl; G=$M.gguf
KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 scripts/peer/make_kl_slice.py $M > $O/$P-ckpt.log 2>&1; echo "ckpt rc=$? $(el)"
$B convert -m $M -o $G > $O/$P-convert.log 2>&1; echo "gguf rc=$? $(el)"
$B quantize $G $BD/k3-q4km.gguf Q4_K_M --tensor-type '_exps=q4_k' -t 4 > $O/$P-k3-quantize.log 2>&1; echo "k3 quantize rc=$? $(el)"
tail -3 $O/$P-k3-quantize.log | cut -c1-160
kb() {  # label file env...
  local l=$1 f=$2; shift 2
  env "$@" timeout 90 $B bench offline -m $f --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,64 -r 2 --mem-bw -1 > $O/$P-$l.txt 2>&1
  echo "$l rc=$? $(el): $(grep -E 'tg32' $O/$P-$l.txt | grep -v ' - ' | awk '{printf "%s ", $0}' | tr -s ' ' | cut -c1-300)"
}
for r in 1 2; do
  [ -f /tmp/llama.done ] && break
  [ $(left) -gt 330 ] || break
  kb k3q-new-r$r $BD/k3-q4km.gguf
  kb k3q-old-r$r $BD/k3-q4km.gguf K3_QUANT_MMA=off
done
while [ ! -f /tmp/llama.done ] && [ $(left) -gt 150 ]; do sleep 2; done; cat /tmp/llama.done 2>/dev/null; tail -2 /tmp/llama-build.log
Q=$BD/ll-q4km.gguf
timeout 120 $LBIN/llama-quantize $G $Q Q4_K_M 16 > $O/$P-llama-quantize.log 2>&1; echo "llama-quantize rc=$? $(el)"
grep -E "quant size|model size" $O/$P-llama-quantize.log
kb llq-new $Q
kb llq-old $Q K3_QUANT_MMA=off
[ $(left) -gt 60 ] && { timeout $(( $(left) - 50 )) $LBIN/llama-batched-bench -m $Q -ngl 99 -fa 1 -c 40000 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,8,64 > $O/$P-llama-batched.txt 2>&1; grep -E "^\|" $O/$P-llama-batched.txt; }
[ $(left) -gt 30 ] && { timeout $(( $(left) - 10 )) $LBIN/llama-bench -m $Q -ngl 99 -fa 1 -p 512 -n 64 -r 3 > $O/$P-llama-bench.txt 2>&1; grep -E "^\|" $O/$P-llama-bench.txt | grep -v -- "---"; }
[ $(left) -gt 45 ] && { timeout 40 $B bench offline -m $Q --device cuda --gemm-precision bf16 --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,8,64 -r 1 --mem-bw -1 > $O/$P-llq-new-bf16.txt 2>&1
  echo "llq-new-bf16: $(grep tg32 $O/$P-llq-new-bf16.txt | grep -v ' - ' | tr -s ' ' | tr '\n' ' ' | cut -c1-300)"; }
echo "done $(el)"
