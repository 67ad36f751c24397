#!/bin/bash
# Session 46 call 5 (issue 18): the whole CUDA suite with the KDA decode kernel pdl-launched (its state loaded before
# the wait), then k3 (pdl KDA) against k3old (the commit before; scripts/gpu-pack-ab) alternating at batch 1: the
# Kimi-Linear-48B dummy (12 layers on an H100) three rounds, batch 8 / 64 one round; the 26.5 GB Kimi-Linear-48B-dims
# GGUF (written on the host while the suite runs) batch 1 two rounds, K3_PDL=0 once. Carry: .gpuwork/k3bins.tar.xz
# .gpuwork/tiktoken.model.xz. Ran as `BUDGET=400 bash scripts/perf/gpu-s46-5.sh` (the device time the session had left).
# (The A/B loops rewritten with lib-k3-bins.sh's bin_ab / env_ab after the call: the same commands and labels.)
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
cuda_suite
kl_dummy_args
bin_ab 3 60 b1 $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW | tee $OUT/ab-kl-dummy.txt
wait $QB; tail -1 /tmp/q48.log
bin_ab 2 40 "gguf b1" -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
[ $(left) -gt 30 ] && { K3_PDL=0 timeout 30 $D/k3 bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 > /tmp/k.txt 2>&1; echo "k3 K3_PDL=0 gguf b1 rc=$? $(grep -E '^\| kl48' /tmp/k.txt)" | tee -a $OUT/ab-gguf.txt; }
for b in 8 64; do [ $(left) -gt 25 ] || break; for v in k3 k3old; do
  timeout 25 $D/$v bench offline $KL -p 0 -n 32 -b $b -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b$b rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee -a $OUT/ab-kl-dummy.txt
echo "done $(el)"
