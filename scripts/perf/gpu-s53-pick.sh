#!/bin/bash
# Session 53: one entry for both prepared calls -- on a card of 100+ GB (an H200) the H200 figures of issue 18's targets
# (gpu-s53-1.sh), else the host CPU's decode copies against llama.cpp (gpu-s53-2.sh), which any card's host can run.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cuda-bins.tar.xz .gpuwork/llama-cpu-slim.tar.xz .gpuwork/tiktoken.model.xz
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "card memory ${mem} MiB"
if [ "$mem" -gt 100000 ]; then exec bash scripts/perf/gpu-s53-1.sh; else exec bash scripts/perf/gpu-s53-2.sh; fi
