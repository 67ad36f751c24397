#!/bin/bash
# Session 49 call 6 (issue 18): the MXFP4 experts' GEMV path (K3_MOE_GEMV=2, not the rule) on 8 lanes a row (twice the
# warps of session 48's 4; K3_MOE_MX_LANES=4 keeps those) against the rule (the ring decode kernels, folded) at one
# token -- CudaMoe.* first (the GEMV forms' same-bits tests at 8 lanes), then alternating arms on the kl48 GGUF b1 and
# the K3-dims dummy b1; ncu of the 8-lane GEMV kernels.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=360
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMoe.*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED|mx down pairs vs items" $OUT/tests.log | head -14
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 3"
env_ab 1 250 "k3 b1" ring "" gemv8 K3_MOE_GEMV=2 $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
wait $QB; tail -1 /tmp/q48.log
GA="-m $G --device cuda --kv-cache-dtype bf16 -p 0"
env_ab 2 110 "gguf b1" ring "" gemv8 K3_MOE_GEMV=2 $GA -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
env_ab 1 60 "gguf b1" ring "" gemv4 "K3_MOE_GEMV=2 K3_MOE_MX_LANES=4" $GA -n 32 -d 512 -b 1 -r 2 | tee -a $OUT/ab-gguf.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ $(left) -gt 40 ] && K3_MOE_GEMV=2 timeout 38 $NCU --kernel-name regex:"gemv_gate_up_mx|gemv_down_mx|down_combine" --launch-skip 30 --launch-count 3 \
    --section SpeedOfLight --section Occupancy $D/k3 bench offline $GA -n 2 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu rc=$? $(el)"
grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput|Achieved Occ" /tmp/ncu.txt | cut -c1-100 | head -12 | tee $OUT/ncu-gemv.txt
echo "done $(el)"
