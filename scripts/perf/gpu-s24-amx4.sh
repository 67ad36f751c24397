#!/bin/bash
# session 24 call 4 (issue 14): amx decode at 16 threads on the GPU host's Xeon, 3-13% behind avx512bf16 on kl-1b in
# calls s24-1 / s24-3. Hypothesis: the pool's workers keep 8 KB of live tile data, saved / restored at every context
# switch; the carried k3 releases the tiles after each AMX call (TILERELEASE), K3_AMX_NORELEASE=1 keeps the old
# behaviour. A second hypothesis (AMX lowers the cores' clock for the whole step) is read off perf stat's cycles
# per second where perf runs. kl-1b and k3-1b-fr from their templates (.gpuwork/amx3), -t 16, 2 rounds alternating.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 560 - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/amx3; D=/tmp/amxb
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1; echo "ckpt $m rc=$? $(el)"
done
v() {  # model name env...
  local m=$1 name=$2; shift 2
  env "$@" timeout 60 $D/k3r bench offline -m /tmp/$m -p 512 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6 | tr '\n' ' ' | sed "s/^/$m $name: /"; echo " $(el)"
}
for r in 1 2; do for m in kl k3fr; do
  [ $(left) -gt 40 ] || break
  v $m amx K3_CPU_ISA=amx
  v $m amx-norelease K3_CPU_ISA=amx K3_AMX_NORELEASE=1
  v $m avx512bf16 K3_CPU_ISA=avx512bf16
done; done | tee $O/s24-4-release.txt
if command -v perf > /dev/null && [ $(left) -gt 40 ]; then
  for isa in amx avx512bf16; do
    K3_CPU_ISA=$isa timeout 30 perf stat -e cycles,instructions,task-clock -o /tmp/ps-$isa.txt $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 1 -t 16 > /dev/null 2>&1
    echo "perf $isa: $(grep -E 'cycles|instructions|task-clock|GHz' /tmp/ps-$isa.txt | tr -s ' ' | tr '\n' ';')" | tee -a $O/s24-4-release.txt
  done
else echo "no perf"; fi
echo "done $(el)"
