#!/bin/bash
# session 27 call 3 (issue 15): a quantised GGUF on the H200 host's Xeon at 16 threads: `k3 quantize ... Q4_K_M` of
# the K3-architecture and the Kimi-Linear-architecture ~1B checkpoints (experts stay MXFP4), the SAME file in k3 and
# llama.cpp 0c1e570 (CPU build in the call): decode tg128 and prefill pp512, three alternating rounds; then k3's
# op profile of one decode.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s27; D=/tmp/b27
lscpu | grep -E 'Model name|^CPU\(s\)'
PEER_K3=k3n; . scripts/perf/lib-cpu-peer.sh
peer_unpack_bins
peer_llama_build_bg
peer_checkpoints kl k3fr
for m in kl k3fr; do
  LD_LIBRARY_PATH=$D $D/k3n quantize /tmp/$m /tmp/$m-q4km.gguf Q4_K_M -t 16 > /tmp/q-$m.log 2>&1; echo "quantize $m rc=$? $(el)"; tail -1 /tmp/q-$m.log
done
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
for r in 1 2 3; do for m in kl k3fr; do
  echo "round $r $m: load $(cut -d' ' -f1-3 /proc/loadavg)"
  LD_LIBRARY_PATH=$D timeout 60 $D/k3n bench offline -m /tmp/$m-q4km.gguf -p 512 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  echo "k3 $m-q4km: $(grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6 | tr '\n' ' ') $(el)"
  timeout 60 $LBIN/llama-bench -m /tmp/$m-q4km.gguf -p 512 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m-q4km: $(grep -E 'pp512|tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-2) $(NF-1)}' | tr '\n' ' ') $(el)"
done; done 2>&1 | tee $O/s27-3-q4km-t16.txt
LD_LIBRARY_PATH=$D K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=8 timeout 40 $D/k3n bench offline -m /tmp/k3fr-q4km.gguf -p 0 -n 128 -r 1 -t 16 > $O/s27-3-prof-k3fr-q4km.txt 2>&1
head -30 $O/s27-3-prof-k3fr-q4km.txt
echo "done $(el)"
