#!/bin/bash
# session 28 call 4: k3-small retrained (the same command as call s28-1) and brought back to the dev box in 15 MiB
# pieces over two calls (call 5 fetches the rest from the warm machine: `ls out/k3small/parts`), so that recipe work
# on it can go on without device time. Carry: .gpuwork/s28.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
mkdir -p /tmp/data && tar -xJf .gpuwork/s28/k3tiny-data.tar.xz -C /tmp/data
PYTHONUNBUFFERED=1 python3 python/k3tiny/train.py --data /tmp/data --out out/k3small --config python/k3tiny/k3small_config.json \
  --minutes 5 --lr 2e-3 --warmup 100 --tokenizer models/k3-tiny > $OUT/s28-4-train.log 2>&1
echo "train rc=$? $(el)"; tail -3 $OUT/s28-4-train.log
mkdir -p out/k3small/parts && tar -C out/k3small -cf - hf | split -b 15M - out/k3small/parts/hf.tar.
( cd out/k3small/parts && sha256sum hf.tar.* > SHA256SUMS ); cp out/k3small/parts/SHA256SUMS $OUT/
ls -la out/k3small/parts; for f in out/k3small/parts/hf.tar.a[a-d]; do mv $f $OUT/; done
echo "done $(el)"
