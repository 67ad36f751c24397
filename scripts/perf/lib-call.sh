# Sourced first by the device-call scripts from session 46 on (scripts/perf/gpu-s46-*.sh): strict variables, the
# elapsed-time printer `el`, `left` (seconds left of $BUDGET, default 585 of the call's 600), GW (the carried .gpuwork
# folder), D (where the binaries go), stdout and stderr kept in $OUT/stdout.txt, and k3's binaries unpacked
# (lib-k3-bins.sh, whose other functions are then defined).
set -u
ROOT=$PWD; T0=$(date +%s)
el() { echo "+$(( $(date +%s) - T0 )) s"; }
left() { echo $(( ${BUDGET:-585} - $(date +%s) + T0 )); }
GW=$ROOT/.gpuwork; D=/tmp/k3b
exec > >(tee "$OUT/stdout.txt") 2>&1
. scripts/perf/lib-k3-bins.sh
k3bins_unpack
