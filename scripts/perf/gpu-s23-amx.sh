#!/bin/bash
# session 23 call 6 (B packed once per matmul; amx opt-in) (issue 14): the amx kernel tier on the GPU host's Xeon (AMX-TILE / AMX-BF16): the CPU kernel
# tests of every tier (CpuKernelsTier/QuantKernelsTier incl. /amx, AmxBf16CloseToAvx512Bf16, CpuIsa), the BF16
# matmul benchmark per tier (1 and 16 threads), and end to end: a random kl-1b (from .gpuwork/amx/kl.tpl.json.xz),
# k3 bench offline -t 16, K3_CPU_ISA=avx512bf16 vs amx alternating, plus one greedy text per tier.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/amx; D=/tmp/amxb
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)'; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
K3_CPU_ISA=amx $D/k3r info 2>&1 | grep -iE 'tier|amx|isa' | head -6
( xz -dc $GW/kl.tpl.json.xz > /tmp/kl.tpl.json && nice python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt.log 2>&1; echo "ckpt rc=$?" ) &
CK=$!
K3_SHARED_DIR=$ROOT/../shared $D/k3t --gtest_filter='*Tier*:*CpuKernels*:*CpuIsa*:*CpuFeatures*:*GgufTiny*:*ReduceTree*' > $O/s23-6-tests.log 2>&1
echo "cpu kernel tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED)|FAILED  \]|SKIPPED \] .*amx" $O/s23-6-tests.log | head -20
grep -E "OK \] .*(amx|Amx)" $O/s23-6-tests.log | wc -l
for t in 1 16; do for isa in avx512bf16 amx; do
  K3_CPU_ISA=$isa K3_NUM_THREADS=$t timeout 120 $D/k3t --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_Matmul' > /tmp/kb-$isa-$t.log 2>&1
  echo "kernelbench $isa t=$t rc=$? $(el)"; grep -iE 'bf16' /tmp/kb-$isa-$t.log | sed "s/^/$isa t$t /" | tee -a $O/s23-6-kernelbench.txt | head -8
done; done
wait $CK; cat /tmp/ckpt.log | tail -2
for r in 1 2; do for isa in avx512bf16 amx; do
  K3_CPU_ISA=$isa timeout 120 $D/k3r bench offline -m /tmp/kl -p 512 -n 32 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  echo "e2e $isa r$r rc=$? $(el)"; grep -E "^\| kl" /tmp/e2e.txt | sed "s/^/$isa r$r /" | tee -a $O/s23-6-e2e.txt
done; done
for isa in avx512bf16 amx; do
  K3_CPU_ISA=$isa timeout 60 $D/k3r run -m /tmp/kl -p "It is a truth universally" -n 24 -t 16 2>/dev/null | tail -2 | sed "s/^/$isa: /" | tee -a $O/s23-6-e2e.txt
done
echo "done $(el)"
