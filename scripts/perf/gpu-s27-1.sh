#!/bin/bash
# session 27 call 1: the whole CUDA check (scripts/gpu-check: every CUDA test against the CPU, greedy + seeded
# text cuda vs cpu, the server e2e suite on --device cuda and --cpu-moe) on the tree after session 26's graph
# changes (MoE block scratch order, the KDA low-rank pair through Backend::linear_batch), which had not run on a
# GPU. Builds k3 + k3_cuda_tests on the device (grammar on: .deps carried; no MPI), keeps the stripped binaries.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'
OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_MPI=OFF" . scripts/gpu-build; echo "build $(el)"; tail -2 /tmp/build.log
OUT=$O K3_GPU_BIN=build/cuda timeout $(( 560 - $(date +%s) + T0 )) scripts/gpu-check > $O/s27-1-gpu-check.txt 2>&1
echo "gpu-check rc=$? $(el)"; tail -12 $O/s27-1-gpu-check.txt
for f in $O/gpu-check/*.log; do [ $(stat -c %s $f) -gt 24000 ] && xz -9 $f; done
mkdir -p /tmp/pk && cp build/cuda/k3 build/cuda/k3_cuda_tests /tmp/pk/ && strip /tmp/pk/* && tar -cJf $O/s27-bins.tar.xz -C /tmp/pk . ; ls -la $O/s27-bins.tar.xz
echo "done $(el)"
