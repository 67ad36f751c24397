#!/bin/bash
# Session 49 call 4 (issue 18): the source-level stall samples of the MXFP4 ring decode kernels at one token on the kl48
# GGUF (Kimi-Linear-48B dims, MXFP4 experts; call s49-3: gate/up at IPC 1.6, 1.08 eligible warps of 5 a scheduler,
# L1TEX waits ~40% of the down kernel's cycles) -- one gate/up and one down launch, per-SASS-line stall columns (csv).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 14
wait $QB; tail -1 /tmp/q48.log
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 $NCU --kernel-name regex:"dec_ring" --launch-skip 20 --launch-count 2 --section WarpStateStats --section SourceCounters \
    --print-units base --page source --csv $D/k3 bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 2 -b 1 -r 1 > $OUT/ncu-src-gguf-b1.csv 2>/dev/null
echo "src rc=$? lines $(wc -l < $OUT/ncu-src-gguf-b1.csv) $(el)"
xz -9 $OUT/ncu-src-gguf-b1.csv
echo "done $(el)"
