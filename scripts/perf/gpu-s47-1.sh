#!/bin/bash
# Session 47 call 1 (issue 18): the whole CUDA suite with every decode-step kernel pdl-launched (commit 4bceb11; also
# the first GPU run of session 46's route-kernel helper refactor), then k3 (4bceb11) against k3old (9f00253, session
# 46's last commit; scripts/gpu-pack-ab 9f00253) alternating: the Kimi-Linear-48B dummy (12 layers on an H100) batch 1
# three rounds, batches 8 / 64 / 256 one round; the 26.5 GB Kimi-Linear-48B-dims GGUF (written on the host while the
# suite runs) batch 1 two rounds and batch 8 once. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
# (The A/B loops rewritten with lib-k3-bins.sh's bin_ab / env_ab after the call: the same commands and labels.)
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
cuda_suite
kl_dummy_args
bin_ab 3 100 b1 $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW | tee $OUT/ab-kl-dummy.txt
wait $QB; tail -1 /tmp/q48.log
bin_ab 2 60 "gguf b1" -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
for b in k3 k3old; do [ $(left) -gt 45 ] || break
  timeout 40 $D/$b bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 8 -r 2 > /tmp/k.txt 2>&1; echo "$b gguf b8 rc=$? $(grep -E '^\| kl48' /tmp/k.txt)"
done | tee -a $OUT/ab-gguf.txt
for bs in 8 64 256; do [ $(left) -gt 30 ] || break; for v in k3 k3old; do
  timeout 30 $D/$v bench offline $KL -p 0 -n 32 -b $bs -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b$bs rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee -a $OUT/ab-kl-dummy.txt
echo "done $(el)"
