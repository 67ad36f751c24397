#!/bin/bash
# session 25 call 3 (issue 14): 16-thread CPU decode on the GPU host's Xeon after the row-chunk rule (whole 16-row
# blocks, >= 64 KB per chunk: K3_ROW_CHUNKS=pool gives the old grain) and the few-token KDA conv; against llama.cpp
# 0c1e570 (CPU build in the call) on the same weights. kl-1b and k3-1b-fr from templates, tg128, -t 16, rounds
# alternating.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-290} - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/s25; D=/tmp/b25
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  cmake --build b -j12 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LB=$!
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1
  echo "ckpt $m rc=$? $(el)"; $D/k3r convert -m /tmp/$m -o /tmp/$m.gguf > /tmp/convert-$m.log 2>&1; echo "convert $m rc=$? $(el)"
done
k() {  # model label env...
  local m=$1 lab=$2; shift 2
  env "$@" timeout 40 $D/k3r bench offline -m /tmp/$m -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6 | tr '\n' ' ' | sed "s/^/k3 $m $lab: /"; echo " $(el)"
}
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do for m in kl k3fr; do
  [ $(left) -gt 40 ] || break
  k $m amx-new K3_CPU_ISA=amx
  k $m amx-pool K3_CPU_ISA=amx K3_ROW_CHUNKS=pool
  k $m avx512bf16-new K3_CPU_ISA=avx512bf16
  timeout 40 $LBIN/llama-bench -m /tmp/$m.gguf -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m r$r: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}') $(el)"
done; done 2>&1 | tee $O/s25-3-tg16.txt
K3_CPU_PROFILE=1 K3_CPU_ISA=amx timeout 40 $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > $O/s25-3-prof-kl-amx-t16.txt 2>&1
grep -A12 "k3 cpu profile" $O/s25-3-prof-kl-amx-t16.txt
echo "done $(el)"
