#!/bin/sh
# `k3 bench allreduce` at 2 ranks (spawned, no mpirun): the table, a JSON that `k3 plan --measured` reads,
# the data check of the first all-reduce, and a clear error for a bad size.
set -eu
K3=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$K3" bench allreduce --tp 2 --sizes 65536,8 -r 3 --warmup 1 -o "$out/ar.json" > "$out/stdout"
grep -q 'over 2 ranks through mpi' "$out/stdout"
python3 - "$out/ar.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ranks"] == 2 and j["allreduce_latency_us"] > 0 and j["allreduce_busbw_gb_s"] > 0, j
assert [r["bytes"] for r in j["results"]] == [8, 65536], j  # sorted: the smallest gives the latency
assert all(r["us"] > 0 for r in j["results"]), j
PY
"$K3" plan --preset kimi-k3 --gpu h200 --tp 8 --measured "$out/ar.json" | grep -q "measured ($out/ar.json)"
if "$K3" bench allreduce --sizes 6 > "$out/err" 2>&1; then echo "FAIL: size 6 accepted"; exit 1; fi
grep -q 'positive multiple of 4' "$out/err"
# 2 GiB per rank is refused before anything is allocated (it would exhaust RAM, not measure a link)
if timeout 10 "$K3" bench allreduce --sizes 2147483648 > "$out/err" 2>&1; then echo "FAIL: 2 GiB accepted"; exit 1; fi
grep -q 'up to 1 GiB' "$out/err"
echo PASS
