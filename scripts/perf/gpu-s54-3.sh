#!/bin/bash
# Session 54 call 3 (issue 15, the CPU of a device host, 16 threads): the pool's chunk hand-out -- each thread's own
# contiguous run first (Claim::Spread, new default; the MoE layer two spread stages) against one shared counter
# (K3_POOL_CLAIM=inorder, the old hand-out):
# (1) `k3 bench memory --job-kib` two alternating rounds; (2) the kl48 Q4_K_M GGUF decode, three alternating rounds;
# (3) one profiled run of each. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz
BUDGET=570
. scripts/perf/lib-call.sh
lscpu | grep -E "Model name|^CPU\(s\)"
kl48_gguf_bg 16
wait $QB; tail -1 /tmp/q48.log; echo "gguf done $(el)"
for r in 1 2; do for c in inorder spread; do
  echo "claim=$c r$r $(el)"
  K3_POOL_CLAIM=$c timeout 60 $D/k3 bench memory --passes 10 --job-kib 64,256,704,1024,2048,5184,16384 -t 16 2>&1
done; done 2>&1 | tee $OUT/cpu-jobs.txt
for r in 1 2 3; do for c in inorder spread; do [ $(left) -gt 100 ] || break
  K3_POOL_CLAIM=$c timeout 100 $D/k3 bench offline -m $G --no-mmap -p 0 -n 64 -r 2 -t 16 > /tmp/k.txt 2>&1
  echo "k3 claim=$c r$r rc=$? $(el) $(grep -E '^\| kl48' /tmp/k.txt) $(grep -oE 'bandwidth [0-9.]+ GB/s' /tmp/k.txt | tr '\n' ' ')"
done; done 2>&1 | tee $OUT/cpu-t16.txt
for c in spread inorder; do [ $(left) -gt 40 ] || break
  K3_POOL_CLAIM=$c K3_CPU_PROFILE=1 timeout 60 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof-$c.txt 2>&1
  echo "profile $c rc=$? $(el)"; grep -vE "^\s*$" $OUT/cpu-prof-$c.txt | sed -n '/cpu profile/,/weights streamed/p' | head -16; grep -E "^\| kl48" $OUT/cpu-prof-$c.txt
done
echo "done $(el)"
