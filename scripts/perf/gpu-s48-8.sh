#!/bin/bash
# Session 48 call 8 (issue 15): the KDA decode kernels (kda_token.h) against the commit before them (k3old = 20e38e1)
# on the host's CPU at 16 threads, more rounds than s48-7 (whose first k3 arm was an outlier): a 10-layer GGUF of
# Kimi-Linear-48B's dimensions (k3 quantize --load-format dummy --num-layers 10, Q4_K_M), so that it is written fast.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=${BUDGET:-150}
. scripts/perf/lib-call.sh
xz -dc "$GW/tiktoken.model.xz" > /tmp/tiktoken.model && python3 scripts/peer/kl48_dummy_dir.py /tmp/kl48 /tmp/tiktoken.model > /dev/null
G=/dev/shm/kl48-10.gguf
$D/k3 quantize --load-format dummy --num-layers 10 /tmp/kl48 $G Q4_K_M -t 16 > /tmp/q.log 2>&1; echo "quantize rc=$? $(el)"
ARM_TIMEOUT=30 bin_ab 4 20 "cpu t16" -m $G --device cpu --no-mmap -t 16 -p 0 -n 32 -b 1 -r 2 | tee $OUT/ab-cpu.txt
echo "done $(el)"
