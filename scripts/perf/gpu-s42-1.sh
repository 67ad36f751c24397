#!/bin/bash
# Session 42 call 1 (an H200: the whole dummy Kimi-Linear-48B is 98 GB): its decode b1 / b64 / b256 against the roofline
# (--mem-bw 4175) after session 41's bench fix (b256 ran out of memory in s41-5); where a batch-1 step goes, kernel by
# kernel (ncu, eager, the difference of a 4-step and a 2-step run); a profile of b256; then K3-dims 4-layer pp32768
# fused MLA prefill vs the SGEMM form (does not fit an H100). Carry: .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 570 - $(date +%s) + T0 )); }
O=$OUT; P=${PFX:-s42-1}; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; ulimit -c 0; export K3_SHARED_DIR=/nonexistent; KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b"
timeout 200 $B bench offline $KL -p 0 -n 64 -b 1,64,256 -r 2 --mem-bw 4175 > $O/$P-kl-tg.txt 2>&1
echo "kl tg rc=$? $(el)"; grep -E "^\| |error" $O/$P-kl-tg.txt | head -6
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do
  timeout 100 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --log-file /tmp/ncu-n$n.csv \
    $B bench offline $KL --enforce-eager -p 0 -n $n -b 1 -r 1 --mem-bw -1 > /tmp/ncu-n$n.out 2>&1
  echo "ncu n=$n rc=$? $(el)"; tail -2 /tmp/ncu-n$n.out
done
python3 $ROOT/scripts/perf/ncu_step_diff.py /tmp/ncu-n2.csv /tmp/ncu-n4.csv 4 > $O/$P-ncu-b1-step.txt 2>&1  # 2 steps x (warm-up + run)
head -30 $O/$P-ncu-b1-step.txt | cut -c1-170; gzip -c /tmp/ncu-n4.csv > $O/$P-ncu-n4.csv.gz
K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 100 $B bench offline $KL -p 0 -n 16 -b 256 -r 1 --mem-bw -1 > $O/$P-kl-prof-b256.txt 2>&1
echo "prof b256 rc=$? $(el)"; grep -E " ms |tg16" $O/$P-kl-prof-b256.txt | head -9
for m in flash fp32 flash fp32; do
  [ $(left) -lt 60 ] && break
  K3_MLA_PREFILL=$m timeout 100 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 32768 -n 0 -b 1 -r 1 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "kimi-k3 4L $m rc=$? $(grep -E '^\| .*pp32768 .*[0-9] \|$|error' /tmp/pp.txt) $(el)"; done | tee $O/$P-k3-pp32k.txt
echo "done $(el)"
