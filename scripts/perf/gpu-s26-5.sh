#!/bin/bash
# session 26 call 5 (issue 14): the MXFP4 one-token prefetch at 16 threads, the measurement call s26-2 lost (a sed
# error) and s26-3's noisy host spoiled: the routed-expert decode layer from DRAM (KernelBench.DISABLED_MoeDecodeLayer,
# 8 of 512 kl-1b-sized experts, avx512bf16 = the amx tier's MXFP4 kernel) and kl-1b tg128 end to end, the default
# (prefetcht0, 8 rows ahead) against prefetcht1 / t2 16 rows ahead and 4 blocks per thread, alternating, 3 rounds.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s26b; D=/tmp/b26
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && xz -dc $GW/k3_tests.xz > $D/k3_tests && chmod +x $D/k3_tests
export LD_LIBRARY_PATH=$D
xz -dc $GW/kl.tpl.json.xz > /tmp/kl.tpl.json && python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt.log 2>&1
echo "ckpt rc=$? $(el)"
V=("default|" "t1 16|K3_MXFP4_PREFETCH=t1 K3_MXFP4_PREFETCH_ROWS=16" "t2 16|K3_MXFP4_PREFETCH=t2 K3_MXFP4_PREFETCH_ROWS=16" "t0 16|K3_MXFP4_PREFETCH_ROWS=16" "4 blocks per thread|K3_BATCH_BLOCKS_PER_THREAD=4")
for r in 1 2 3; do for v in "${V[@]}"; do
  lab=${v%%|*}; ev=${v#*|}
  echo "layer r$r $lab: $(env $ev K3_MOE_BENCH_EXPERTS=512 K3_CPU_ISA=avx512bf16 K3_NUM_THREADS=16 timeout 30 $D/k3_tests --gtest_also_run_disabled_tests --gtest_filter=KernelBench.DISABLED_MoeDecodeLayer 2>&1 | grep 'one fork-join' | sed 's/.*(matmul_two_stage)//')"
done; done 2>&1 | tee $O/s26-5-moe-layer.txt
for r in 1 2 3; do for v in "${V[@]}"; do
  lab=${v%%|*}; ev=${v#*|}
  env $ev K3_CPU_ISA=amx timeout 30 $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  echo "kl tg128 r$r $lab: $(grep -E '^\| kl' /tmp/e2e.txt | cut -d'|' -f6,9 | tr '\n' ' ') $(el)"
done; done 2>&1 | tee $O/s26-5-tg16.txt
echo "done $(el)"
