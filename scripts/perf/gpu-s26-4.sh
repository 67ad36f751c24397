#!/bin/bash
# session 26 call 4 (issue 14): call s26-3's CPU half ran on a host whose speed swung +-50% within the call (llama.cpp
# and k3 alike), so this repeats the 16-thread decode comparison alone: the final build (k3r: router + shared gate /
# up grouped, the low-rank batch, the shared down beside the experts, the fused few-token conv) against the build
# with the grouping only (k3mid), llama.cpp 0c1e570 (CPU build in the call) on k3's GGUF of the same weights,
# alternating, with the host's load average and free memory printed before each round.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s26; D=/tmp/b26
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  nice cmake --build b -j14 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LB=$!
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1
  echo "ckpt $m rc=$? $(el)"; LD_LIBRARY_PATH=$D $D/k3r convert -m /tmp/$m -o /tmp/$m.gguf > /tmp/convert-$m.log 2>&1; echo "convert $m rc=$? $(el)"
done
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
k() {  # binary model label env...
  local b=$1 m=$2 lab=$3; shift 3
  env LD_LIBRARY_PATH=$D "$@" timeout 40 $D/$b bench offline -m /tmp/$m -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  echo "k3 $m $lab: $(grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6,9 | tr '\n' ' ') $(el)"
}
LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do for m in kl k3fr; do
  echo "round $r $m: load $(cut -d' ' -f1-3 /proc/loadavg), $(grep MemAvailable /proc/meminfo | tr -s ' ')"
  k k3r $m "final" K3_CPU_ISA=amx
  k k3mid $m "grouped only" K3_CPU_ISA=amx
  timeout 40 $LBIN/llama-bench -m /tmp/$m.gguf -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m r$r: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}') $(el)"
done; done 2>&1 | tee $O/s26-4-tg16.txt
echo "done $(el)"
