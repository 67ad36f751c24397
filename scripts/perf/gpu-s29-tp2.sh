#!/bin/bash
# Prepared in session 28 for the next nvidia-h200-x2 call (issue 20; not run yet): (1) scripts/gpu-tp-check again --
# the 3-ranks-on-2-GPUs group (tiny-kimi-linear TP3+EP) hung in call s28-7 and is fixed since (dist/gpu_placement.h);
# (2) dummy Kimi-Linear-48B (`--load-format dummy --preset kimi-linear-48b-a3b`: under --tp since session 28,
# model/dummy_checkpoint.h) at TP1 on one GPU vs TP2 over NCCL on two: decode b1 / b64 / b256 and prefill 4096, the
# issue's targets being b1 latency <= 0.7x TP1 and b256 throughput >= 1.6x.
# Carry: .gpuwork/deps.tar.xz .gpuwork/ompi5.tar.xz. Kind: nvidia-h200-x2.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT
K3_TP_CMAKE_EXTRA="-DK3_GRAMMAR=OFF" OUT=$O timeout 300 bash scripts/gpu-tp-check; echo "tp-check rc=$? $(el)"
export OPAL_PREFIX=/opt/ompi PATH=/opt/ompi/bin:$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
B=build/cuda/k3; A="bench offline --load-format dummy --preset kimi-linear-48b-a3b --device cuda -r 2 --mem-bw -1"
for w in "-p 4096 -n 0 -b 1" "-p 0 -n 32 -b 1,64,256"; do
  tag=$(echo $w | tr -d ' -' | cut -c1-12)
  timeout 150 $B $A $w > $O/bench-tp1-$tag.txt 2>&1; echo "tp1 [$w] rc=$? $(el)"; grep -E "^\| kimi" $O/bench-tp1-$tag.txt | head -4
  timeout 200 mpirun --oversubscribe -x LD_LIBRARY_PATH -x OPAL_PREFIX -np 2 $B $A $w --tp 2 > $O/bench-tp2-$tag.txt 2>&1
  echo "tp2 [$w] rc=$? $(el)"; grep -E "^\| kimi" $O/bench-tp2-$tag.txt | head -4
done
tar -C $O -cJf $O/tp-check.tar.xz tp-check && rm -rf $O/tp-check; echo "done $(el)"
