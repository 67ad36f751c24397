#!/bin/bash
# session 24 (issue 14): why amx decode is ~10% slower than avx512bf16 at 16 threads on the GPU host's Xeon
# (call s24-1). Temporary knobs in the carried k3 (not committed): K3_AMX_NR1 (one-token calls walk 16 rows per
# block instead of 32: half the concurrent row streams), K3_AMX_PF=D (prefetcht1 of the block's rows D steps
# ahead). kl-1b tg128 (and pp512) -t 16 per variant, 2 rounds alternating.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/amx2; D=/tmp/amxb
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
xz -dc $GW/kl.tpl.json.xz > /tmp/kl.tpl.json && python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt.log 2>&1; echo "ckpt rc=$? $(el)"
v() {  # name env...
  local name=$1; shift
  env "$@" timeout 60 $D/k3r bench offline -m /tmp/kl -p 512 -n 128 -r 2 -t ${TH:-16} > /tmp/e2e.txt 2>&1
  grep -E "^\| kl" /tmp/e2e.txt | cut -d'|' -f3,6 | tr '\n' ' ' | sed "s/^/$name t${TH:-16}: /"; echo " $(el)"
}
for r in 1 2; do
  v bf16 K3_CPU_ISA=avx512bf16
  v amx K3_CPU_ISA=amx
  v amx-nr1 K3_CPU_ISA=amx K3_AMX_NR1=1
  v amx-pf8 K3_CPU_ISA=amx K3_AMX_PF=8
  v amx-pf16 K3_CPU_ISA=amx K3_AMX_PF=16
  v amx-nr1-pf8 K3_CPU_ISA=amx K3_AMX_NR1=1 K3_AMX_PF=8
done | tee $O/s24-2-variants.txt
for th in 4 8; do TH=$th v bf16 K3_CPU_ISA=avx512bf16; TH=$th v amx K3_CPU_ISA=amx; done | tee -a $O/s24-2-variants.txt
echo "done $(el)"
