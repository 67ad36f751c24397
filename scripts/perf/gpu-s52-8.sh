#!/bin/bash
# Session 52 call 8 (issues 18 and 15): (1) the MLA wgmma kernel's fine form (K3_MLA_WG_FINE=1: per-column-block
# mbarriers, S waiting block by block, each block refilled when its last reader releases it -- FlashMLA's overlap)
# against the two-stage form: the MLA decode tests (both forms against the CPU and each other), memcheck / synccheck
# on the fine form, the BF16 kernel timing (both forms per shape, one process); (2) s52-7's kl48 GGUF against
# llama.cpp's CUDA backend on today's code. Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cuda-bins.tar.xz
# .gpuwork/tiktoken.model.xz.
BUDGET=560
. scripts/perf/lib-call.sh
mla_decode_checks K3_MLA_WG_FINE=1
[ $(left) -gt 260 ] || { echo "no time for the GGUF $(el)"; exit 0; }
kl48_vs_llama_cuda
echo "done $(el)"
