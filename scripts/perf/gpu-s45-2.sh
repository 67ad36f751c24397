#!/bin/bash
# Session 45 call 2: main after s45-1 (the MoE down kernel's register change reverted; the pdl-launched one-token GEMV
# kept): the whole CUDA suite; Kimi-Linear-48B dummy b1 with K3_PDL=1 / 0 alternating (an H100: its first 12 layers);
# then issue 15 on the host's cores: llama.cpp 0c1e570 (CPU build, in the background during the suite) on k3's Q4_K_M
# of kl-1b's template at 16 threads, beside k3, stderr kept (s45-1's llama-bench lines came back empty).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins) .gpuwork/kl.tpl.json.xz .gpuwork/llama-cpu-slim.tar.xz
. scripts/perf/lib-call.sh
. scripts/perf/lib-cpu-peer.sh
peer_kl1b_prep_during_suite
for r in 1 2 3; do for P in 1 0; do
  K3_PDL=$P timeout 60 $D/k3 bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "pdl=$P b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
Q=/dev/shm/kl-q4km.gguf
for r in 1 2; do [ $(left) -gt 40 ] || break
  { echo "round $r $(el)"
    timeout 40 $D/k3 bench offline -m $Q --no-mmap -p 0 -n 128 -r 2 -t 16 2>&1 | grep -E "memory read|^\| kl"
    timeout 40 $LBIN/llama-bench -m $Q -p 0 -n 128 -t 16 -r 2 -o md 2>&1 | grep -vE "^\s*$" | tail -4; } 2>&1 | tee -a $OUT/cpu-t16.txt
done
echo "done $(el)"
