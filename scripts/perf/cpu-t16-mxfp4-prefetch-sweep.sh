#!/bin/bash
# A device-host CPU sweep (issue 15; written in session 50, not yet run): the one-token MXFP4 rows' software prefetch
# on the host's 16 threads -- hint (K3_MXFP4_PREFETCH t1 default / t2 / t0) x distance (K3_MXFP4_PREFETCH_BYTES 4096
# default / 8192 / 16384) on the kl48 GGUF, alternating with the default each round, then the op profile of the best.
# Session 50 saw t0 halve the step there (s50-2) while it sped the experts up 25% on a 2-thread Zen 4 box: the rate of
# these rows at 16 threads (84 GB/s against 102-112 for the other products, s48-4) is a question of lines in flight
# per core, which only that host can answer. ~6 min. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=${BUDGET:-500}
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
wait $QB; tail -1 /tmp/q48.log
CA="-m $G --no-mmap -p 0 -n 32 -r 1 -t 16"
for v in "K3_MXFP4_PREFETCH=t2" "K3_MXFP4_PREFETCH_BYTES=8192" "K3_MXFP4_PREFETCH_BYTES=16384" "K3_MXFP4_PREFETCH=t2 K3_MXFP4_PREFETCH_BYTES=8192"; do
  ARM_TIMEOUT=60 env_ab 1 60 "cpu t16" default "" "${v// /,}" "$v" $CA
done | tee $OUT/cpu-t16-prefetch-sweep.txt
[ $(left) -gt 40 ] && K3_CPU_PROFILE=1 timeout 40 $D/k3 bench offline $CA > /tmp/prof.txt 2>&1
grep -E "moe_experts|Q6_K|Q4_K|% of BW|kl48" /tmp/prof.txt | head -8 | tee $OUT/cpu-prof-t16.txt
echo "done $(el)"
