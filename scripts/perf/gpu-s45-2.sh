#!/bin/bash
# Session 45 call 2: main after s45-1 (the MoE down kernel's register change reverted; the pdl-launched one-token GEMV
# kept): the whole CUDA suite; Kimi-Linear-48B dummy b1 with K3_PDL=1 / 0 alternating (an H100: its first 12 layers);
# then issue 15 on the host's cores: llama.cpp 0c1e570 (CPU build, in the background during the suite) on k3's Q4_K_M
# of kl-1b's template at 16 threads, beside k3, stderr kept (s45-1's llama-bench lines came back empty).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins) .gpuwork/kl.tpl.json.xz .gpuwork/llama-cpu-slim.tar.xz
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 585 - $(date +%s) + T0 )); }
GW=$ROOT/.gpuwork; D=/tmp/k3b
mkdir -p $D; tar -xJf $GW/k3bins.tar.xz -C $D; export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export K3_SHARED_DIR=/nonexistent; nvidia-smi --query-gpu=name --format=csv,noheader; ulimit -c 0
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-slim.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  nice cmake --build b -j10 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LB=$!
( xz -dc $GW/kl.tpl.json.xz > /tmp/kl.tpl.json && nice python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt.log 2>&1 &&
  nice $D/k3 quantize /tmp/kl /dev/shm/kl-q4km.gguf Q4_K_M -t 4 > /tmp/q.log 2>&1; echo "kl-q4km rc=$?" >> /tmp/q.log ) &
QB=$!
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1); LAY=""; BW=4175; [ "$MEM" -lt 100000 ] && LAY="--num-layers 12" && BW=3350
KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b $LAY"
timeout 200 $D/k3_cuda_tests > $OUT/suite.log 2>&1; echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) " $OUT/suite.log | head; xz -9 $OUT/suite.log
wait $LB $QB; tail -1 /tmp/llama-build.log; tail -1 /tmp/q.log; echo "cpu prep done $(el)"
for r in 1 2 3; do for P in 1 0; do
  K3_PDL=$P timeout 60 $D/k3 bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "pdl=$P b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
Q=/dev/shm/kl-q4km.gguf; LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do [ $(left) -gt 40 ] || break
  { echo "round $r $(el)"
    timeout 40 $D/k3 bench offline -m $Q --no-mmap -p 0 -n 128 -r 2 -t 16 2>&1 | grep -E "memory read|^\| kl"
    timeout 40 $LBIN/llama-bench -m $Q -p 0 -n 128 -t 16 -r 2 -o md 2>&1 | grep -vE "^\s*$" | tail -4; } 2>&1 | tee -a $OUT/cpu-t16.txt
done
echo "done $(el)"
