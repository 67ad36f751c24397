#!/bin/bash
# session 40 calls 4 / 5 (issue 18): the KDA decode kernel as a cluster of D/32 blocks of 32 value columns per
# (seq, head) against the one-block form, on the same warm machine, two calls back to back (the two packs do not
# fit one carry): `gpu-s40-4.sh old` with .gpuwork/k3bins-old.tar.xz (the commit before), `gpu-s40-4.sh new` with
# .gpuwork/k3bins.tar.xz. Each: CudaKda.Timing (decode step batch 1 / 64 / 256, H 32, D 128), then the dummy
# Kimi-Linear-48B decode at batch 1 / 64 / 256 (the whole model on an H200; 12 layers on an H100), graphs on;
# `new` then runs the KDA and speculative-verification tests and the whole CUDA suite (SUITE=0: not the suite).
# PFX: the log prefix (s40-4; s40-7 for the second kernel form).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-570} - $(date +%s) + T0 )); }
W=${1:?old or new}; O=$OUT; P=${PFX:-s40-4}-$W; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
G=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$G"
if [ $W = old ]; then PK=$GW/k3bins-old.tar.xz; else PK=$GW/k3bins.tar.xz; fi
tar -xJf $PK -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 120 $T --gtest_filter='CudaKda.Timing' > $O/$P-kda-timing.log 2>&1
echo "kda timing rc=$? $(el)"; grep "decode step" $O/$P-kda-timing.log
case "$G" in *H200*) L="";; *) L="--num-layers 12";; esac
for r in 1 2; do
  timeout 150 $B bench offline --device cuda --load-format dummy --preset kimi-linear-48b-a3b $L -p 0 -n 64 -b 1,64,256 -r 2 --mem-bw 4175 > /tmp/tg.txt 2>&1
  echo "## kl tg $W round $r rc=$? $(el) $L" >> $O/$P-kl-tg.txt; grep -E "^\| .*tg64" /tmp/tg.txt >> $O/$P-kl-tg.txt
done
cat $O/$P-kl-tg.txt
if [ $W = new ] && [ "${SUITE:-1}" != skip ]; then
  timeout 200 $T --gtest_filter='CudaKda*:CudaModelDummy.*:Tiny/CudaModelE2E.*:CudaSpec*:CudaBlockDrafter*' > $O/$P-kda-tests.log 2>&1
  echo "kda tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure" $O/$P-kda-tests.log | head; grep -E "kda \] decode D=128 H=3 B=5 bounded=1 step 2|bit" $O/$P-kda-tests.log | head -5
  [ "${SUITE:-1}" = 0 ] || timeout $(( $(left) - 10 )) $T --gtest_filter='-*Timing*' > $O/$P-suite.log 2>&1
  echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure" $O/$P-suite.log | head; xz -9 $O/$P-suite.log; xz -9 $O/$P-kda-tests.log
fi
echo "done $(el)"
