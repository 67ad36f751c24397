#!/bin/bash
# session 40 call 8 (issue 18): the MLA MHA prefill on split-bf16 tensor-core products (default) against its fp32
# SGEMM form (K3_MLA_PREFILL=fp32): accuracy (CudaModelDummy.MlaPrefill*, the e2e prefill tests against the CPU),
# then pp4096 of the Kimi-Linear-dims and K3-dims 4-layer dummies, alternating, and a profile of each; then the
# whole CUDA suite. Carry: .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${LIMIT:-570} - $(date +%s) + T0 )); }
O=$OUT; P=s40-8; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
timeout 150 $T --gtest_filter='CudaModelDummy.MlaPrefill*:Tiny/CudaModelE2E.*:CudaMla.*' > $O/$P-tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |Failure|MLA prefill|prefill n=" $O/$P-tests.log | head -30
for r in 1 2; do for pre in kimi-linear-48b-a3b kimi-k3; do for m in split fp32; do
  if [ $m = fp32 ]; then export K3_MLA_PREFILL=fp32; else unset K3_MLA_PREFILL; fi
  timeout 60 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --mem-bw -1 > /tmp/pp.txt 2>&1
  echo "$pre $m round $r rc=$? $(grep -E '^\| .*pp4096 .*[0-9] \|$' /tmp/pp.txt)"; done; done; done | tee $O/$P-pp.txt
unset K3_MLA_PREFILL
for pre in kimi-linear-48b-a3b kimi-k3; do
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 90 $B bench offline --device cuda --load-format dummy --preset $pre --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --mem-bw -1 > $O/$P-prof-pp-$pre.txt 2>&1
  echo "prof $pre rc=$?"; grep -E "mla attn|linear|moe experts" $O/$P-prof-pp-$pre.txt
done
echo "$(el)"
timeout $(( $(left) - 10 )) $T --gtest_filter='-*Timing*' > $O/$P-suite.log 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |tests ran|Failure" $O/$P-suite.log | head; xz -9 $O/$P-suite.log; xz -9 $O/$P-tests.log
echo "done $(el)"
