#!/bin/bash
# session 25 call 6 (issue 18 item 1): the KDA state kernel v2 (kda_tc_state2.cu: warps split the value columns,
# S^T in registers, no cross-warp exchange per chunk) on the H200: correctness of every variant on variable-length
# batches against the fp32 recurrence (scripts/check_kda_tc.py), then the one-process bench against fla chunk_kda
# (bc3b101d, carried as source) at the K3 shape and two others.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-250} - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/${GWDIR:-s25k}
mkdir -p /tmp/fla && tar -xJf $GW/fla-src.tar.xz -C /tmp/fla
nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
  scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu src/k3/backend/cuda/kda_tc_state2.cu \
  -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1; echo "shim rc=$? $(el)"; tail -3 /tmp/kdabuild.log
PYTHONUNBUFFERED=1 timeout 90 python3 scripts/check_kda_tc.py /tmp/libkdashim.so > $O/s25-6-kda-check.log 2>&1; echo "check rc=$? $(el)"
cat $O/s25-6-kda-check.log | cut -c1-190
KDA_BENCH_SHAPES=1x8192x96,8x1024x96,1x8192x32 KDA_BENCH_ONLY="bv32 buf1 bf16-in intra2,bv64 buf1 bf16-in intra2,state-v2,safe_gate" \
  PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout $(( $(left) - 10 )) python3 scripts/bench_kda_tc.py /tmp/libkdashim.so > $O/s25-6-kda-bench.log 2>&1
echo "bench rc=$? $(el)"; grep -E "GPU| ms " $O/s25-6-kda-bench.log | cut -c1-150
echo "done $(el)"
