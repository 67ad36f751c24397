#!/bin/bash
# Session 47 call 4 (issues 18 and 15): the whole CUDA suite on the session's final GPU code (every decode kernel
# pdl-launched, the batched one-token bf16 GEMV as the rule); k3 (final) against k3old (06dd6c8, call s47-1's k3:
# scripts/gpu-pack-ab 06dd6c8) on the Kimi-Linear-48B dummy (12 layers on an H100) at batch 1 (two alternating rounds),
# 8, 64 and 256, and on the 26.5 GB Kimi-Linear-48B-dims GGUF at batch 1 and 8; then, if the host has perf, a
# call-graph profile of k3's 16-thread CPU decode of the GGUF (for the issue-15 ops at 16 threads). Carry:
# .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
cuda_suite
kl_dummy_args
for r in 1 2; do for b in k3 k3old; do [ $(left) -gt 200 ] || break
  timeout 40 $D/$b bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$b b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-kl-dummy.txt
for bs in 8 64 256; do for b in k3 k3old; do [ $(left) -gt 170 ] || break
  timeout 30 $D/$b bench offline $KL -p 0 -n 32 -b $bs -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$b b$bs rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee -a $OUT/ab-kl-dummy.txt
wait $QB; tail -1 /tmp/q48.log
for bs in 1 8; do for b in k3 k3old; do [ $(left) -gt 110 ] || break
  timeout 40 $D/$b bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b $bs -r 2 > /tmp/k.txt 2>&1; echo "$b gguf b$bs rc=$? $(grep -E '^\| kl48' /tmp/k.txt)"
done; done | tee $OUT/ab-gguf.txt
if command -v perf > /dev/null && [ $(left) -gt 80 ]; then
  timeout 60 perf record -g -F 499 -o /tmp/perf.data $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > /tmp/pb.txt 2>&1; echo "perf rc=$? $(el) $(grep -E '^\| kl48' /tmp/pb.txt)"
  timeout 60 perf report -i /tmp/perf.data --stdio --no-children --percent-limit 0.4 --sort symbol 2>/dev/null | grep -vE "^$|^#" | grep -E "%" | head -60 > $OUT/cpu-perf-t16.txt
  head -30 $OUT/cpu-perf-t16.txt
else echo "no perf on the host ($(command -v perf || echo missing))"; fi
echo "done $(el)"
