#!/bin/bash
# Session 42 call 2: the batch-1 decode kernels -- the warp routing on redux.sync, the bf16 GEMV rewrite (gemv_bf16.cu: rows split over warps, all
# loads of a batch in flight, PDL), the MoE GEMV kernels' loads hoisted, the register-held norms, the shared expert
# fused into the MoE GEMV kernels. The whole CUDA suite; then old binary (k3old, the code at s42-1) vs new,
# alternating, new with K3_GEMV_V1=1 (the first GEMV kernel) and with K3_MOE_SHARED_FUSED=0 (isolate those two), whole dummy Kimi-Linear-48B decode b1 (an H200; on an H100 its first 12 layers), b256
# once each; an ncu step split of the new code at batch 1. Carry: .gpuwork/k3bins.tar.xz (k3, k3old, k3_cuda_tests),
# packed by `scripts/gpu-pack-ab 3dad5ee` (k3old: session 41's CUDA code) from a tree with the session-42 CUDA work
# (branch s42-gpu, or main after reverting the commit that took it out; docs/perf/cuda.md "Session 42").
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-570} - $(date +%s) + T0 )); }
O=$OUT; P=${PFX:-s42-2}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; BO=/tmp/k3b/k3old; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
LAY=""; [ "$MEM" -lt 100000 ] && LAY="--num-layers 12"
KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b $LAY"; echo "model: kimi-linear-48b-a3b $LAY"
timeout 240 $T > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran" $O/$P-suite.log | head -12; xz -9 $O/$P-suite.log
for r in 1 2; do for v in old new v1 nofuse; do
  case $v in old) BIN=$BO; E="";; new) BIN=$B; E="";; v1) BIN=$B; E="K3_GEMV_V1=1";; nofuse) BIN=$B; E="K3_MOE_SHARED_FUSED=0";; esac
  env $E timeout 100 $BIN bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw 4175 > /tmp/tg.txt 2>&1
  echo "$v r$r rc=$? $(grep -E '^\| .*tg64 .*[0-9] \|$|error' /tmp/tg.txt) $(el)"
done; done | tee $O/$P-ab-b1.txt
for v in old new; do
  BIN=$B; [ $v = old ] && BIN=$BO
  timeout 100 $BIN bench offline $KL -p 0 -n 32 -b 256 -r 1 --mem-bw 4175 > /tmp/tg.txt 2>&1
  echo "$v b256 rc=$? $(grep -E '^\| .*tg32 .*[0-9] \|$|error' /tmp/tg.txt) $(el)"
done | tee $O/$P-ab-b256.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do
  [ $(left) -lt 90 ] && break
  timeout 110 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --log-file /tmp/ncu-n$n.csv \
    $B bench offline $KL --enforce-eager -p 0 -n $n -b 1 -r 1 --mem-bw -1 > /tmp/ncu-n$n.out 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 $ROOT/scripts/perf/ncu_step_diff.py /tmp/ncu-n2.csv /tmp/ncu-n4.csv 4 > $O/$P-ncu-b1-step.txt 2>&1
head -24 $O/$P-ncu-b1-step.txt | cut -c1-170
echo "done $(el)"
