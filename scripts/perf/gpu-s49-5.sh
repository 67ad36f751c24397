#!/bin/bash
# Session 49 call 5 (issue 18): the decode path's staging handed out token-slowest (k3 = HEAD) against the fold without
# it (k3old = 7e3d50e, scripts/gpu-pack-ab) -- the whole CUDA suite on HEAD, then alternating k3 / k3old on the kl48
# GGUF b1 (3 rounds), the K3-dims dummy b1 / b64, ncu of the ring launches at b1 on the GGUF.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=560
. scripts/perf/lib-call.sh
kl48_gguf_bg 8
cuda_suite
xz -dc $OUT/suite.log.xz | grep -E "folded vs launches" | awk '{s+=$(NF-4)} END {print "fold lines", NR, "differing floats", s}'
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 3"
bin_ab 2 300 "k3 b1" $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
bin_ab 1 270 "k3 b64" $K3A -p 0 -n 32 -d 512 -b 64 -r 2 | tee -a $OUT/ab-k3.txt
wait $QB; tail -1 /tmp/q48.log
GA="-m $G --device cuda --kv-cache-dtype bf16 -p 0"
bin_ab 3 120 "gguf b1" $GA -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
bin_ab 1 80 "gguf b8" $GA -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-gguf.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ $(left) -gt 50 ] && timeout 45 $NCU --kernel-name regex:"dec_ring|dec_combine" --launch-skip 30 --launch-count 3 \
    --section SpeedOfLight $D/k3 bench offline $GA -n 2 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu rc=$? $(el)"
grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput" /tmp/ncu.txt | cut -c1-100 | head -12 | tee $OUT/ncu-ring.txt
echo "done $(el)"
