#!/bin/bash
# Session 53 call 1 (issues 18 and 15; measurement only: the GPU kernels of session 52's end, 7522f34): on an H200 if one
# comes (the card; sessions 44-52 ran on H100s)
#  1. issue 18's K3-slice target with its MLA layer: the K3-dims dummy, 4 layers (K3's first MLA layer is its
#     fourth; 3 on an 80 GB card), batch 1 / 8 / 64 / 256 at depth 512, and batch 1 / 64 at depth 8192 with the
#     default (fp32) and the bf16 MLA cache (the wgmma kernel's rows) -- session 51's unrun gpu-s51-4.sh, folded in;
#  2. the Kimi-Linear-48B dummy (all 27 layers on an H200) at batch 1 / 64 / 256: the target row's H200 figures;
#  3. issue 15's GPU target on the card: the 26.5 GB Kimi-Linear-48B-dims GGUF (k3's Q4_K_M, MXFP4 routed
#     experts) in k3 against llama.cpp 0c1e570's CUDA llama-batched-bench -fa 1 on the same file, batch 1-16, two
#     alternating rounds (s46-3's form; that call ran on an H100).
# Each bench carries the bench's roofline column (--mem-bw: 4175 GB/s on an H200, the measured copy rate; 3350 on an
# 80 GB card). Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cuda-bins.tar.xz .gpuwork/tiktoken.model.xz (with
# models/k3-tiny's weights, tests/data, docs/perf and the drafter files moved out of the tree for the 64 MiB cap).
BUDGET=520
. scripts/perf/lib-call.sh
decode_targets
[ $(left) -gt 170 ] || { echo "no time for the GGUF $(el)"; exit 0; }
kl48_vs_llama_cuda
# 4. the kernel rows of the target table on the same card: the MoE decode kernels (K3 QAT and Kimi-Linear shapes, n = 1 / 8 / 64)
#    and the BF16 MLA decode kernel at nh 32 / 96 (all batches and contexts of the timing test)
[ $(left) -gt 90 ] && { K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout 80 $D/k3_cuda_tests --gtest_filter='CudaMoe.Timing' > $OUT/moe-timing.log 2>&1
  echo "moe timing rc=$? $(el)"; grep -iE "timing|us" $OUT/moe-timing.log | head -30; }
[ $(left) -gt 60 ] && { K3_MLA_TIMING_DTYPE=bfloat16 timeout 60 $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' > $OUT/mla-timing.log 2>&1
  echo "mla timing rc=$? $(el)"; grep "timing" $OUT/mla-timing.log | head -30; }
echo "done $(el)"
