#!/bin/bash
# session 25 call 2 (issue 14): where a 16-thread CPU decode step goes on the GPU host's Xeon (K3_CPU_PROFILE=1: wall
# time per op, matmuls by shape with their GB/s); kl-1b and k3-1b-fr from their templates, avx512bf16 and amx, 16 and
# 8 threads; the machine's NUMA / cache layout for reading the numbers.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s25; D=/tmp/b25
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3|MHz' ; nproc
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1; echo "ckpt $m rc=$? $(el)"
done
for m in kl k3fr; do for isa in avx512bf16 amx; do for t in 16 8; do
  [ $m = k3fr ] && [ $t = 8 ] && continue
  K3_CPU_PROFILE=1 K3_CPU_ISA=$isa timeout 90 $D/k3r bench offline -m /tmp/$m -p 0 -n 128 -r 2 -t $t > $O/s25-2-prof-$m-$isa-t$t.txt 2>&1
  echo "== $m $isa t$t rc=$? $(el)"; grep -E "^\| $m|k3 cpu profile|bandwidth" $O/s25-2-prof-$m-$isa-t$t.txt
  grep -A14 "k3 cpu profile" $O/s25-2-prof-$m-$isa-t$t.txt | tail -13
done; done; done
echo "done $(el)"
