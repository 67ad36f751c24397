#!/bin/bash
# Session 46 call 3 (issues 15 and 18), the 26.5 GB Kimi-Linear-48B-dims GGUF of calls s46-1 / s46-2 (all 27 layers,
# k3's Q4_K_M, MXFP4 routed experts) on the GPU: k3 with the MoE decode's new combine / GLU-finish kernels (k3) against
# the commit before them (k3old; scripts/gpu-pack-ab 9af1078), alternating, batch 1-16 at depth 512; llama.cpp 0c1e570's
# CUDA llama-batched-bench -fa 1 on the same file (prebuilt on the dev box for sm_90, static, stripped:
# .gpuwork/llama-cuda-bins.tar.xz, 41 MB -- the call moves models/k3-tiny, tests/data, docs/perf and the drafter files
# out of the carried tree to fit the 64 MiB cap, so only the synthetic-shape CudaMoe tests run). Carry:
# .gpuwork/k3bins.tar.xz (gpu-pack-ab) .gpuwork/llama-cuda-bins.tar.xz .gpuwork/tiktoken.model.xz
. scripts/perf/lib-call.sh
LC=/tmp/llc; mkdir -p $LC && tar -xJf $GW/llama-cuda-bins.tar.xz -C $LC; echo "llama cuda rc=$? $(el)"
kl48_gguf_bg 12
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMoe.*' > $OUT/moe-tests.log 2>&1
echo "moe tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|floats differ" $OUT/moe-tests.log | head -12
wait $QB; tail -1 /tmp/q48.log
K3A="bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2"
for r in 1 2; do [ $(left) -gt 150 ] || break
  for b in k3 k3old; do timeout 80 $D/$b $K3A > /tmp/k.txt 2>&1; echo "$b r$r rc=$? $(el)"; grep -E "^\| kl48" /tmp/k.txt; done
  timeout 120 $LC/llama-batched-bench -m $G -ngl 99 -fa 1 -c 16384 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,2,4,8,16 > /tmp/l.txt 2>&1
  echo "llama r$r rc=$? $(el)"; grep -E "^\||error|failed" /tmp/l.txt | tail -8
done 2>&1 | tee $OUT/gpu-kl48.txt
echo "done $(el)"
