#!/bin/bash
# Issue 20 on an nvidia-h200-x2 machine, the parts beside the speed runs (scripts/perf/gpu-s29-tp2.sh): (1)
# scripts/gpu-tp-check -- TP2 / EP2 / TP4+EP logits vs one GPU, greedy text TP2 == one process, and the 3-ranks-on-2-GPUs
# group fixed in session 28 (dist/gpu_placement.h) -- (2) two processes as two "nodes" on the two GPUs
# (`--nnodes 2`, the TCP rendezvous; tests/mpi/nnodes_logits.sh, each node on its own GPU), and (3) `k3 serve --tp 2
# --device cuda` against one process through the HTTP API (tests/mpi/serve_tp.py: greedy text plain / streamed / chat /
# concurrent under preemption / after a prefix-cache hit, cancellation, a worker killed mid-generation, no orphans; it
# needs no openai package since session 29's tests/e2e/server_util.py).
# Carry: .gpuwork/deps.tar.xz .gpuwork/ompi5.tar.xz. Kind: nvidia-h200-x2 (prepared in session 29, not run yet).
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=${OUT:-/tmp/out}; mkdir -p $O
K3_TP_CMAKE_EXTRA="-DK3_GRAMMAR=OFF" OUT=$O timeout 330 bash scripts/gpu-tp-check; echo "tp-check rc=$? $(el)"
export OPAL_PREFIX=/opt/ompi PATH=/opt/ompi/bin:$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu K3_NUM_THREADS=2
TPC=build/cuda/tests/k3_tp_check; B=build/cuda/k3
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
timeout 120 sh tests/mpi/nnodes_logits.sh $TPC models/k3-tiny --device cuda > $O/nnodes2-cuda.log 2>&1
echo "nnodes 2 (two processes, one GPU each) rc=$? $(el)"; tr -d '\000' < $O/nnodes2-cuda.log | grep -E "ranks|node 0|error" | head -4 | cut -c1-300
K3_SERVE_ARGS="--device cuda" K3_CPU_ISA=exact timeout 240 python3 tests/mpi/serve_tp.py $B -v > $O/serve-tp2-cuda.log 2>&1
echo "serve --tp 2 --device cuda vs one process rc=$? $(el)"; grep -E "^(Ran|OK|FAILED)|\.\.\. (ok|FAIL|ERROR)" $O/serve-tp2-cuda.log | head -20
tar -C $O -cJf $O/tp-check.tar.xz tp-check 2>/dev/null && rm -rf $O/tp-check; echo "done $(el)"
