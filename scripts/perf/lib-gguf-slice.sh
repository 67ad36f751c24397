# Sourced by device-call scripts (scripts/perf/gpu-s30-4.sh, gpu-s31-1.sh): llama.cpp's own Q4_K_M of the
# Kimi-Linear-dims 4-layer slice, as calls s29-4 / s30-2 measured it. Expects ROOT, GW (.gpuwork), BD (a work dir),
# el (elapsed-time printer); carry .gpuwork/llama-cuda-slim.tar.xz and .gpuwork/tiktoken.model.xz.
# llama_quantize_bg: a CPU-only llama-quantize build in the background (/tmp/llamaq.done when finished).
llama_quantize_bg() {
  ( cd $BD && tar -xJf $GW/llama-cuda-slim.tar.xz && cd llama.cpp &&
    cmake -S . -B bq -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llamaq-cfg.log 2>&1 &&
    cmake --build bq -j6 --target llama-quantize > /tmp/llamaq-build.log 2>&1; echo "llama-quantize build rc=$? $(el)" > /tmp/llamaq.done ) &
}
# kl_slice_q4km K3_BINARY: writes the slice (scripts/peer/make_kl_slice.py), its BF16 GGUF (k3 convert) and, once
# llama_quantize_bg is done, $BD/ll-q4km.gguf (3847.05 MiB: the writer is seeded, the quantiser deterministic).
kl_slice_q4km() {
  local b=$1 m=$BD/slice-kl
  xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model
  KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 $ROOT/scripts/peer/make_kl_slice.py $m > /tmp/ckpt.log 2>&1 &&
    $b convert -m $m -o $m.gguf > /tmp/convert.log 2>&1; echo "ckpt+gguf rc=$? $(el)"
  while [ ! -f /tmp/llamaq.done ]; do sleep 1; done; cat /tmp/llamaq.done
  timeout 100 $BD/llama.cpp/bq/bin/llama-quantize $m.gguf $BD/ll-q4km.gguf Q4_K_M 16 > /tmp/llama-quantize.log 2>&1
  echo "llama-quantize rc=$? $(el)"
}
# llama_cuda_bg TARGETS...: llama.cpp's CUDA build (sm_90) of TARGETS in $BD/llama.cpp/b, in the background once
# llama_quantize_bg has unpacked the source (/tmp/llama.done when finished; ~400 s beside k3's own build).
# With .gpuwork/llama-cuda-bins.tar.xz carried (llama-bench / llama-batched-bench built on the dev box for sm_90, static
# ggml: see the comment below) it unpacks those instead of building (~450 s of a call).
llama_cuda_bg() {
  local targets="$*"
  if [ -f $GW/llama-cuda-bins.tar.xz ]; then
    mkdir -p $BD/llama.cpp/b/bin && tar -xJf $GW/llama-cuda-bins.tar.xz -C $BD/llama.cpp/b/bin &&
      echo "llama prebuilt rc=$? $(el)" > /tmp/llama.done
    return
  fi
  ( while [ ! -f $BD/llama.cpp/CMakeLists.txt ]; do sleep 1; done; sleep 5; cd $BD/llama.cpp &&
    cmake -S . -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
    cmake --build b -j${LLAMA_JOBS:-12} --target $targets > /tmp/llama-build.log 2>&1; echo "llama build rc=$? $(el)" > /tmp/llama.done ) &
}
# kl_slice_q4km_k3 K3_BINARY: the same slice, quantised by k3 itself (no llama.cpp: session 34 could not fetch its
# source, 1.47 GB over the snapshot limit): k3's Q4_K_M with kv_b's halves as llama-quantize types them (Q5_0 / Q4_K),
# so that the CPU's absorbed MLA reads them as stored. Writes $BD/k3-q4km.gguf.
kl_slice_q4km_k3() {
  local b=$1 m=$BD/slice-kl
  xz -dc $GW/tiktoken.model.xz > /tmp/tiktoken.model
  KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent python3 $ROOT/scripts/peer/make_kl_slice.py $m > /tmp/ckpt.log 2>&1
  echo "ckpt rc=$? $(el)"
  $b quantize $m $BD/k3-q4km.gguf Q4_K_M --tensor-type attn_k_b=q5_0 --tensor-type attn_v_b=q4_k > /tmp/k3-quantize.log 2>&1
  echo "k3 quantize rc=$? $(el)"; tail -12 /tmp/k3-quantize.log
}
# Dev-box prebuild (session 37; nvcc 13, 2 cores: about an hour): in the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp,
#   cmake -S . -B bcuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF \
#     -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
#     -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
#   cmake --build bcuda -j2 --target llama-batched-bench llama-bench
#   tar -cJf $ROOT/.gpuwork/llama-cuda-bins.tar.xz -C bcuda/bin llama-batched-bench llama-bench
# (the tree, the k3 binaries and this must stay under the call's 64 MiB: move models/k3-tiny/model.safetensors out).
