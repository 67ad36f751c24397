#!/bin/bash
# Session 52 call 8 (issues 18 and 15): (1) the MLA wgmma kernel's fine form (K3_MLA_WG_FINE=1: per-column-block
# mbarriers, S waiting block by block, each block refilled when its last reader releases it -- FlashMLA's overlap)
# against the two-stage form: the MLA decode tests (both forms against the CPU and each other), memcheck / synccheck
# on the fine form, the BF16 kernel timing (both forms per shape, one process); (2) s52-7's kl48 GGUF against
# llama.cpp's CUDA backend on today's code. Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cuda-bins.tar.xz
# .gpuwork/tiktoken.model.xz.
BUDGET=560
. scripts/perf/lib-call.sh
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.*' > $OUT/mla-tests.log 2>&1
echo "mla tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|fine vs|fine 1 nh= 96" $OUT/mla-tests.log | head -20
CS=/usr/local/cuda/bin/compute-sanitizer
for tool in memcheck synccheck; do
  K3_MLA_WG_FINE=1 timeout 100 $CS --tool $tool $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > /tmp/cs.log 2>&1
  echo "$tool rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
done | tee $OUT/sanitizers.txt
K3_MLA_TIMING_DTYPE=bfloat16 timeout 200 $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' > $OUT/mla-timing.log 2>&1
echo "timing rc=$? $(el)"; grep "timing" $OUT/mla-timing.log | sed -e 's/simt .*| wgmma  /| wgmma  /' | head -30
[ $(left) -gt 260 ] || { echo "no time for the GGUF $(el)"; exit 0; }
LC=/tmp/llc; mkdir -p $LC && tar -xJf $GW/llama-cuda-bins.tar.xz -C $LC; echo "llama cuda rc=$? $(el)"
kl48_gguf_bg 16
wait $QB; tail -1 /tmp/q48.log
K3G="bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2"
for r in 1 2; do [ $(left) -gt 60 ] || break
  timeout 80 $D/k3 $K3G > /tmp/k.txt 2>&1; echo "k3 r$r rc=$? $(el)"; grep -E "^\| kl48" /tmp/k.txt
  timeout 100 $LC/llama-batched-bench -m $G -ngl 99 -fa 1 -c 16384 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,2,4,8,16 > /tmp/l.txt 2>&1
  echo "llama r$r rc=$? $(el)"; grep -E "^\||error|failed" /tmp/l.txt | tail -8
done 2>&1 | tee $OUT/gpu-kl48.txt
echo "done $(el)"
