#!/bin/bash
# session 24 call 3 (issue 14): k3 (amx, now the default tier) against llama.cpp's CPU backend on the GPU host's Xeon
# (16 cores), same weights, both architectures of the CPU gate: kl-1b (Kimi-Linear) and k3-1b-fr (K3 with the
# full-rank KDA gate, which llama.cpp's kimi-k3 graph needs). Carried in .gpuwork/amx3: bins.tar.xz (release k3 as
# k3r + its libraries), kl.tpl.json.xz / k3fr.tpl.json.xz (scripts/random_checkpoint.py templates),
# llama-cpu-src.tar.xz (llama.cpp 0c1e570, CPU sources). Per model, 2 rounds alternating: k3 -t 16 (amx), k3 -t 16
# K3_CPU_ISA=avx512bf16, llama-bench -t 16; pp512 and tg128.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 580 - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/amx3; D=/tmp/amxb
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
$D/k3r info -m tests/data/tiny-k3 2>&1 | grep -iE 'cpu kernels'
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > $O/s24-3-llama-cfg.log 2>&1 &&
  cmake --build b -j8 --target llama-bench > $O/s24-3-llama-build.log 2>&1; echo "llama build rc=$?" >> $O/s24-3-llama-build.log ) &
LB=$!
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1
  echo "ckpt $m rc=$? $(el)"; $D/k3r convert -m /tmp/$m -o /tmp/$m.gguf > /tmp/convert-$m.log 2>&1; echo "convert $m rc=$? $(el)"
done
wait $LB; tail -1 $O/s24-3-llama-build.log; echo "llama $(el)"
LBIN=/tmp/ll/llama.cpp/b/bin
for m in k3fr kl; do for r in 1 2; do
  [ $(left) -gt 70 ] || break
  for isa in amx avx512bf16; do
    K3_CPU_ISA=$isa timeout 60 $D/k3r bench offline -m /tmp/$m -p 512 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
    echo "k3 $m $isa r$r rc=$? $(el)"; grep -E "^\| $m" /tmp/e2e.txt | sed "s/^/k3 $isa r$r /" | tee -a $O/s24-3-e2e.txt
  done
  timeout 60 $LBIN/llama-bench -m /tmp/$m.gguf -p 512 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m r$r rc=$? $(el)"; grep -E "pp512|tg128" /tmp/ll.txt | sed "s/^/llama $m r$r /" | tee -a $O/s24-3-e2e.txt
done; done
echo "done $(el)"
