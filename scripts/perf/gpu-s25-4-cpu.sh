#!/bin/bash
# session 25 call 4, CPU part (issue 14): kl-1b decode at 16 threads on the GPU host's Xeon, amx: the projection
# groups (K3_CPU_LINEAR_GROUP=0: one matmul per projection) and the MoE's one fork-join (K3_MOE_TWO_STAGE=0) A/B,
# alternating, and per-op profiles of the timed steps only (K3_CPU_PROFILE_SKIP: the warm-up and prefill skipped).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; GW=$ROOT/.gpuwork/s25; D=/tmp/b25
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
xz -dc $GW/kl.tpl.json.xz > /tmp/kl.tpl.json && python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt-kl.log 2>&1; echo "ckpt kl rc=$? $(el)"
k() {  # label env...
  local lab=$1; shift
  env K3_CPU_ISA=amx "$@" timeout 40 $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  grep -E "^\| kl" /tmp/e2e.txt | cut -d'|' -f3,6,9 | tr '\n' ' ' | sed "s/^/k3 kl $lab: /"; echo " $(el)"
}
for r in 1 2; do
  k default; k group-off K3_CPU_LINEAR_GROUP=0; k twostage-off K3_MOE_TWO_STAGE=0; k rowchunks-pool K3_ROW_CHUNKS=pool
done 2>&1 | tee $O/s25-4-cpu-ab.txt
for v in default:X=1 twostage-off:K3_MOE_TWO_STAGE=0; do
  env K3_CPU_ISA=amx K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=130 ${v#*:} timeout 40 $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > $O/s25-4-prof-${v%%:*}.txt 2>&1
  echo "== profile ${v%%:*}"; grep -A16 "k3 cpu profile" $O/s25-4-prof-${v%%:*}.txt
done
echo "cpu done $(el)"
