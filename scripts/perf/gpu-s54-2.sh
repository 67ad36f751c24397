#!/bin/bash
# Session 54 call 2 (issue 15, the CPU of a device host, 16 threads): (1) `k3 bench memory --job-kib`: the read rate in
# back-to-back parallel jobs of a decode product's size, the thread pool's old form (K3_POOL_ALWAYS_NOTIFY=1: mutex +
# signal every job) against the new (only for sleepers), two alternating rounds; (2) the kl48 Q4_K_M GGUF (lib-k3-bins.sh
# kl48_gguf_bg) decode, the same two pool forms alternating; (3) one profiled run (new form) and one mmap run (peak RSS
# with the experts' stored pages released, if the binary has that change). Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz
BUDGET=570
. scripts/perf/lib-call.sh
lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"
kl48_gguf_bg 16
wait $QB; tail -2 /tmp/q48.log; echo "gguf done $(el)"; free -g | head -2
for r in 1 2; do for ev in 1 0; do
  echo "pool always_notify=$ev r$r $(el)"
  K3_POOL_ALWAYS_NOTIFY=$ev timeout 60 $D/k3 bench memory --passes 10 --job-kib 64,256,1024,2048,5184,16384 -t 16 2>&1
done; done 2>&1 | tee $OUT/cpu-jobs.txt
for r in 1 2; do for ev in 1 0; do [ $(left) -gt 120 ] || break
  K3_POOL_ALWAYS_NOTIFY=$ev timeout 100 $D/k3 bench offline -m $G --no-mmap -p 0 -n 64 -r 2 -t 16 > /tmp/k.txt 2>&1
  echo "k3 always_notify=$ev r$r rc=$? $(el)"; grep -E "memory read|^\| kl48|loaded|peak RSS|repacked" /tmp/k.txt
done; done 2>&1 | tee $OUT/cpu-t16.txt
[ $(left) -gt 70 ] && { K3_CPU_PROFILE=1 timeout 70 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof.txt 2>&1
  echo "profile rc=$? $(el)"; grep -vE "^\s*$" $OUT/cpu-prof.txt | head -34; }
[ $(left) -gt 60 ] && { timeout 60 $D/k3 bench offline -m $G -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-mmap.txt 2>&1
  echo "mmap rc=$? $(el)"; grep -E "memory read|^\| kl48|loaded|peak RSS|repacked" $OUT/cpu-mmap.txt; }
echo "done $(el)"
