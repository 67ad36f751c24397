#!/bin/sh
# The ways --tensor-parallel-size is refused, each with one clear line and exit status 1.
# usage: cli_errors.sh MPIEXEC K3 MODEL
set -u
mpiexec=$1 k3=$2 model=$3
fail=0
expect() {  # expect TEXT command...: exit status 1 and TEXT on stderr
  text=$1
  shift
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -ne 1 ] || ! printf '%s' "$err" | grep -qF -- "$text"; then
    echo "FAIL: '$*' gave status $rc and: $err"
    fail=1
  else
    echo "ok: $text"
  fi
}
expect "start k3 under MPI, one process per rank: mpirun -np 2" "$k3" run -m "$model" -p hi -n 1 --tp 2
expect "--tensor-parallel-size 3 but mpirun started 2 processes" "$mpiexec" -np 2 "$k3" run -m "$model" -p hi -n 1 --tp 3
expect "without --tensor-parallel-size: pass --tensor-parallel-size 2" "$mpiexec" -np 2 "$k3" run -m "$model" -p hi -n 1
expect "runs on --device cpu (over MPI) so far" "$k3" run -m "$model" -p hi -n 1 --tp 2 --device cuda
expect "does not combine with" "$k3" run -m "$model" -p hi -n 1 --tp 2 --cpu-moe
exit $fail
