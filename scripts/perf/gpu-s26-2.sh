#!/bin/bash
# session 26 call 2 (issue 14): 16-thread CPU decode on the H200 host's Xeon after the fork-join merges (the MoE
# router in one linear_group with the shared experts' gate / up, the KDA low-rank second halves in one
# linear_batch): the build before them (k3old) against the new one, same call, alternating, with llama.cpp
# 0c1e570 (CPU build in the call) on k3's GGUF of the same weights; the MXFP4 one-token prefetch level / distance
# as variants (K3_MXFP4_PREFETCH, K3_MXFP4_PREFETCH_ROWS); a per-op profile of the new build.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s26; D=/tmp/b26
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
lscpu | grep -E 'Model name|^CPU\(s\)|L3'
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  nice cmake --build b -j12 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LB=$!
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1
  echo "ckpt $m rc=$? $(el)"; $D/k3r convert -m /tmp/$m -o /tmp/$m.gguf > /tmp/convert-$m.log 2>&1; echo "convert $m rc=$? $(el)"
done
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
k() {  # binary model label env...
  local b=$1 m=$2 lab=$3; shift 3
  env "$@" timeout 40 $D/$b bench offline -m /tmp/$m -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6,9 | tr '\n' ' ' | sed "s/^/k3 $m $lab: /"; echo " $(el)"
}
LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do for m in kl k3fr; do
  k k3r $m "new" K3_CPU_ISA=amx
  k k3old $m "old (s25)" K3_CPU_ISA=amx
  k k3r $m "new pf t1/16" K3_CPU_ISA=amx K3_MXFP4_PREFETCH=t1 K3_MXFP4_PREFETCH_ROWS=16
  k k3r $m "new pf t2/16" K3_CPU_ISA=amx K3_MXFP4_PREFETCH=t2 K3_MXFP4_PREFETCH_ROWS=16
  k k3r $m "new pf t0/16" K3_CPU_ISA=amx K3_MXFP4_PREFETCH_ROWS=16
  timeout 40 $LBIN/llama-bench -m /tmp/$m.gguf -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m r$r: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}') $(el)"
done; done 2>&1 | tee $O/s26-2-tg16.txt
for b in k3r k3old; do
  K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=130 K3_CPU_ISA=amx timeout 40 $D/$b bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > $O/s26-2-prof-kl-$b.txt 2>&1
  grep -A30 "k3 cpu profile" $O/s26-2-prof-kl-$b.txt | head -32
done
echo "done $(el)"
