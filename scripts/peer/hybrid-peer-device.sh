#!/bin/bash
# The hybrid peer measurement of session 8 (docs/perf/hybrid.md), as run on the H200 host through the device
# tool. Prepare on the dev machine (nothing of llama.cpp is committed):
#   tar -cJf .gpuwork/llama/llama-src.tar.xz -C LLAMA_SRC --exclude='ggml/src/ggml-'{virtgpu,cann,openvino,webgpu,et,metal,hexagon,sycl,vulkan,opencl,zdnn,musa,rpc,blas,zendnn} \
#     --exclude=tools/ui --exclude=tools/server CMakeLists.txt cmake ggml src include common tools vendor gguf-py conversion \
#     convert_hf_to_gguf.py scripts/build-info.sh licenses        # 4 MB; LLAMA_SRC = llama.cpp 0c1e570
#   cp LLAMA_SRC/models/templates/Kimi-K*.jinja .gpuwork/llama/   # the converter reads the chat template
#   scripts/random_checkpoint.py template /work/gate/k3-1b-fr .gpuwork/llama/k3-1b-fr.tpl.json
#   cp scripts/peer/hybrid-peer-device.sh .gpuwork/llama/run.sh
# then run `bash .gpuwork/llama/run.sh` with carry [".gpuwork/deps.tar.xz", ".gpuwork/llama"] (~7.5 min: the
# llama.cpp CUDA build takes 385 s on 16 cores).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
. scripts/gpu-build || exit 1
( mkdir -p /tmp/llama && cd /tmp/llama && tar -xJf "$OLDPWD/.gpuwork/llama/llama-src.tar.xz" &&
  mkdir -p models/templates && cp "$OLDPWD"/.gpuwork/llama/*.jinja models/templates/ &&
  cmake -S . -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_BUILD_TYPE=Release > $OUT/llama-cfg.log 2>&1 &&
  nice cmake --build b -j16 --target llama-bench llama-batched-bench > $OUT/llama-build.log 2>&1 ) &
LB=$!
python3 scripts/random_checkpoint.py write .gpuwork/llama/k3-1b-fr.tpl.json /tmp/k3fr > $OUT/ckpt.log 2>&1
wait $LB; echo "llama built $(el)"
python3 scripts/peer/convert_gguf.py /tmp/llama /tmp/k3fr /tmp/k3fr.gguf > $OUT/conv.log 2>&1; echo "converted $(el)"
B=build/cuda/k3; M=/tmp/k3fr; G=/tmp/k3fr.gguf; LBIN=/tmp/llama/b/bin
k3b() { local tag=$1; shift; echo "== k3 $tag $(el)"; timeout 90 $B bench offline -m $M "$@" -o $OUT/k3-$tag.json 2>&1 | grep -E "^\| k3|error"; }
lb() { local tag=$1; shift; echo "== llama $tag $(el)"; timeout 150 $LBIN/llama-bench -m $G "$@" 2>&1 | grep -E "^\||error" | grep -v -- "---"; }
for round in 1 2; do
  lb hyb$round -ngl 99 -ot exps=CPU -t 16 -p 512 -n 128 -fa 1 -r 3
  k3b hyb$round --device cuda --cpu-moe -t 16 -p 512 -n 128 -b 1 -r 3
done
lb gpu -ngl 99 -t 16 -p 512 -n 128 -fa 1 -r 3
k3b gpu --device cuda -p 512 -n 128 -b 1 -r 3
lb pp2k -ngl 99 -ot exps=CPU -t 16 -p 2048 -n 0 -fa 1 -r 2
k3b pp2k --device cuda --cpu-moe -t 16 -p 2048 -n 0 -b 1 -r 2
timeout 120 $LBIN/llama-batched-bench -m $G -ngl 99 -ot exps=CPU -t 16 -fa 1 -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,8 2>&1 | grep -E "^\|"
k3b hyb-b8 --device cuda --cpu-moe -t 16 -p 128 -n 64 -b 8 -r 2
echo "done $(el)"
