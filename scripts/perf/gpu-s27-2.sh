#!/bin/bash
# session 27 call 2 (issue 14): 16-thread decode on the H200 host's Xeon after the two fused decode passes (KDA: conv +
# norms, gates, recurrence, output gate per (sequence, head); MLA: absorb / attend / up-project per (token, heads)):
# k3n (this build) against k3old (session 26's final build) and llama.cpp 0c1e570 (CPU build in the call) on k3's
# GGUF of the same weights, three alternating rounds, host load printed before each; then one op profile of each k3.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s27; D=/tmp/b27
lscpu | grep -E 'Model name|^CPU\(s\)'
PEER_K3=k3n; . scripts/perf/lib-cpu-peer.sh
peer_unpack_bins
peer_llama_build_bg
peer_checkpoints kl k3fr
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
for r in 1 2 3; do for m in kl k3fr; do
  echo "round $r $m: load $(cut -d' ' -f1-3 /proc/loadavg), $(grep MemAvailable /proc/meminfo | tr -s ' ')"
  peer_k3_tg k3n $m "fused" K3_CPU_ISA=amx
  peer_k3_tg k3old $m "s26" K3_CPU_ISA=amx
  peer_llama_tg $m $r
done; done 2>&1 | tee $O/s27-2-tg16.txt
for b in k3n k3old; do
  LD_LIBRARY_PATH=$D K3_CPU_ISA=amx K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=8 timeout 40 $D/$b bench offline -m /tmp/kl -p 0 -n 128 -r 1 -t 16 > $O/s27-2-prof-kl-$b.txt 2>&1
  echo "profile $b $(el)"; grep -E "kda|mla|^\| kl" $O/s27-2-prof-kl-$b.txt
done
echo "done $(el)"
