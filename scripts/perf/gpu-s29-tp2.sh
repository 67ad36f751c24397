#!/bin/bash
# Prepared in session 28 for the next nvidia-h200-x2 call (issue 20; not run yet): (1) scripts/gpu-tp-check again --
# the 3-ranks-on-2-GPUs group (tiny-kimi-linear TP3+EP) hung in call s28-7 and is fixed since (dist/gpu_placement.h);
# (2) the Kimi-Linear-48B true-dims slice (scripts/peer/make_kl_slice.py, 4 layers, 6.3B params: the issue-18 slice;
# `--load-format dummy` does not combine with --tp yet) at TP1 on one GPU vs TP2 over NCCL on two: decode b1 / b64 /
# b256 and prefill 4096, the targets being b1 latency <= 0.7x TP1 and b256 throughput >= 1.6x.
# Carry: .gpuwork/deps.tar.xz .gpuwork/ompi5.tar.xz .gpuwork/s29 (tiktoken.model.xz). Kind: nvidia-h200-x2.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; M=/tmp/slice-kl
xz -dc .gpuwork/s29/tiktoken.model.xz > /tmp/tiktoken.model
( KIMI_TIKTOKEN=/tmp/tiktoken.model K3_SHARED_DIR=/nonexistent nice python3 scripts/peer/make_kl_slice.py $M > /tmp/ckpt.log 2>&1
  echo "ckpt rc=$?" >> /tmp/ckpt.log ) &
K3_TP_CMAKE_EXTRA="-DK3_GRAMMAR=OFF" OUT=$O timeout 300 bash scripts/gpu-tp-check; echo "tp-check rc=$? $(el)"
export OPAL_PREFIX=/opt/ompi PATH=/opt/ompi/bin:$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
while ! grep -q "ckpt rc" /tmp/ckpt.log 2>/dev/null; do sleep 2; done; tail -1 /tmp/ckpt.log; echo "slice $(el)"
B=build/cuda/k3; A="bench offline -m $M --device cuda -p 4096 -n 32 -b 1,64,256 -r 2 --mem-bw -1"
timeout 150 $B $A > $O/bench-tp1.txt 2>&1; echo "tp1 rc=$? $(el)"; grep -E "^\| " $O/bench-tp1.txt | head -8
timeout 200 mpirun --oversubscribe -x LD_LIBRARY_PATH -x OPAL_PREFIX -np 2 $B $A --tp 2 > $O/bench-tp2.txt 2>&1
echo "tp2 rc=$? $(el)"; grep -E "^\| " $O/bench-tp2.txt | head -8
tar -C $O -cJf $O/tp-check.tar.xz tp-check && rm -rf $O/tp-check; echo "done $(el)"
