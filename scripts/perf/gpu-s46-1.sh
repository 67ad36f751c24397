#!/bin/bash
# Session 46 call 1. Issue 18: the whole CUDA suite on main (session 45's tree route kernel ran only the MoE / model
# tests) with the new four-warp route form (CudaMoe.RouteTiming prints rule / warp / block / scan at both shapes).
# Issue 15: a GGUF at Kimi-Linear-48B's true dimensions (all 27 layers; routed experts MXFP4 as K3 ships them, the
# rest k3's Q4_K_M), written on the host by `k3 quantize --load-format dummy` (scripts/peer/kl48_dummy_dir.py): the
# host's 16-thread decode by k3 and by llama.cpp 0c1e570 (CPU build) on that one file, alternating, with the memory
# rate read around each k3 test; then k3 on the GPU on the same file (batch 1-16, the same-GGUF table's batches).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins) .gpuwork/llama-cpu-slim.tar.xz .gpuwork/tiktoken.model.xz
. scripts/perf/lib-call.sh
. scripts/perf/lib-cpu-peer.sh
peer_llama_slim_bg
kl48_gguf_bg 6
cuda_suite
xz -dc $OUT/suite.log.xz | grep -E "timing \] (moe_route|graph of)" | tee $OUT/route-timing.txt
wait $LB $QB; tail -1 /tmp/llama-build.log; tail -12 /tmp/q48.log; df -h /dev/shm | tail -1; echo "cpu prep done $(el)"
peer_gguf_rounds_t16 $G 150
[ $(left) -gt 150 ] && { K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=2 timeout 80 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof-t16.txt 2>&1; echo "prof rc=$? $(el)"; }
[ $(left) -gt 70 ] && timeout $(( $(left) - 20 )) $D/k3 bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2 > $OUT/gpu-k3-kl48.txt 2>&1
echo "gpu rc=$? $(el)"; grep -E "^\|" $OUT/gpu-k3-kl48.txt | head -8
echo "done $(el)"
