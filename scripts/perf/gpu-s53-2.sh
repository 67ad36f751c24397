#!/bin/bash
# Session 53 call 2 (issue 15, the CPU side on the device host): the MXFP4 experts' decode copies (mxfp4_rowblocks.h,
# wired this session) at 16 threads on the 26.5 GB GGUF at Kimi-Linear-48B's true dimensions (k3's Q4_K_M, MXFP4 routed
# experts; lib-k3-bins.sh kl48_gguf_bg): k3 with the copies (forced: K3_CPU_MXFP4_ROWBLOCKS=1), without (=0) and
# llama.cpp 0c1e570's llama-bench on the same file, two alternating rounds (lib-cpu-peer.sh's form, s46-2), each k3 run
# with the memory rate read around it; then one profiled step with the copies (the experts' GB/s).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cpu-slim.tar.xz .gpuwork/tiktoken.model.xz
BUDGET=560
. scripts/perf/lib-call.sh
. scripts/perf/lib-cpu-peer.sh
peer_llama_slim_bg
kl48_gguf_bg 6
wait $LB $QB; tail -1 /tmp/llama-build.log; tail -2 /tmp/q48.log; echo "cpu prep done $(el)"; free -g | head -2
for r in 1 2; do
  for c in 1 0; do [ $(left) -gt 100 ] || break
    K3_CPU_MXFP4_ROWBLOCKS=$c timeout 100 $D/k3 bench offline -m $G --no-mmap -p 0 -n 64 -r 2 -t 16 > /tmp/k.txt 2>&1
    echo "k3 copies=$c r$r rc=$? $(el)"; grep -E "memory read|moved|^\| kl48|loaded|peak RSS" /tmp/k.txt
  done
  [ $(left) -gt 60 ] || break
  timeout 60 $LBIN/llama-bench -m $G -p 0 -n 64 -t 16 -r 2 -o md > /tmp/l.txt 2>&1; echo "llama r$r rc=$? $(el)"; grep -E "tg64|error" /tmp/l.txt
done 2>&1 | tee $OUT/cpu-t16.txt
[ $(left) -gt 70 ] && { K3_CPU_MXFP4_ROWBLOCKS=1 K3_CPU_PROFILE=1 timeout 70 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof.txt 2>&1
  echo "profile rc=$? $(el)"; grep -iE "moe_experts|linear|GB/s" $OUT/cpu-prof.txt | head -20; }
echo "done $(el)"
