#!/bin/bash
# session 28 call 7 (issue 20, the first 2-GPU machine lent): scripts/gpu-tp-check on nvidia-h200-x2 -- mpirun ranks
# take the host's GPUs round-robin, so 2-rank groups run NCCL between two GPUs (3 / 4 ranks share them: host-staged);
# then, if time is left, a dummy Kimi-Linear-48B 8-layer slice at TP1 vs TP2 (decode b1, prefill 512).
# Carry: .gpuwork/deps.tar.xz .gpuwork/ompi5.tar.xz.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=index,name --format=csv,noheader; nvidia-smi topo -m 2>/dev/null | head -4
K3_TP_CMAKE_EXTRA="-DK3_GRAMMAR=OFF" OUT=$OUT timeout 230 bash scripts/gpu-tp-check; echo "tp-check rc=$? $(el)"
O=$OUT/tp-check; export OPAL_PREFIX=/opt/ompi PATH=/opt/ompi/bin:$PATH OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
grep -h -i "nccl\|collectives" $O/tp-tiny-k3.log 2>/dev/null | head -3
B=build/cuda/k3; A="bench offline --load-format dummy --preset kimi-linear-48b-a3b --num-layers 8 -p 512 -n 32 -r 2 --device cuda"
if [ $(( $(date +%s) - T0 )) -lt 250 ] && [ -x $B ]; then
  timeout 40 $B $A > $O/bench-tp1.log 2>&1; echo "bench tp1 rc=$? $(el)"; grep -E "^\| " $O/bench-tp1.log | head -4
  timeout 50 mpirun --oversubscribe -x LD_LIBRARY_PATH -x OPAL_PREFIX -np 2 $B $A --tp 2 > $O/bench-tp2.log 2>&1
  echo "bench tp2 rc=$? $(el)"; grep -E "^\| " $O/bench-tp2.log | head -4
fi
tar -C $OUT -cJf $OUT/s28-7-tp-check.tar.xz tp-check && rm -rf $OUT/tp-check; echo "done $(el)"
