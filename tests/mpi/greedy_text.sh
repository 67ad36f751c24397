#!/bin/sh
# Greedy text of `k3 run` on one process vs `mpirun -np N k3 run --tensor-parallel-size N [flags]`: the
# same bytes (the engine, the serving cache manager and the journaled cache memory end to end).
# usage: greedy_text.sh MPIEXEC K3 N MODEL [extra k3 flags...]
set -eu
mpiexec=$1 k3=$2 np=$3 model=$4
shift 4
prompt="Once upon a time"
one=$("$k3" run -m "$model" -p "$prompt" -n 40 --temp 0)
many=$("$mpiexec" -np "$np" --oversubscribe "$k3" run -m "$model" -p "$prompt" -n 40 --temp 0 --tensor-parallel-size "$np" "$@")
echo "1 process : $one"
echo "$np ranks   : $many"
[ -n "$one" ] && [ "$one" = "$many" ]
