#!/bin/sh
# The ways --tensor-parallel-size is refused, each with one clear line and exit status 1.
# usage: cli_errors.sh MPIEXEC K3 MODEL
set -u
mpiexec=$1 k3=$2 model=$3
fail=0
tmp_err=$(mktemp)
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
expect "--tensor-parallel-size 3 but mpirun started 2 processes" "$mpiexec" -np 2 "$k3" run -m "$model" -p hi -n 1 --tp 3
expect "without --tensor-parallel-size: pass --tensor-parallel-size 2" "$mpiexec" -np 2 "$k3" run -m "$model" -p hi -n 1
# GPU ranks need the CUDA backend (this is the CPU build); a malformed device fails before any rank starts.
expect "built without the CUDA backend" "$k3" run -m "$model" -p hi -n 1 --tp 2 --device cuda
expect "expected cpu, cuda or cuda:N" "$k3" run -m "$model" -p hi -n 1 --tp 2 --device tpu
expect "does not combine with" "$k3" run -m "$model" -p hi -n 1 --tp 2 --cpu-moe
expect "--ep-all-to-all and --expert-placement apply with --enable-expert-parallel" "$k3" run -m "$model" -p hi -n 1 --tp 2 --ep-all-to-all
expect "expert placement: not a permutation of 0..31 (entry 0)" "$mpiexec" -np 2 "$k3" run -m "$model" -p hi -n 1 --tp 2 \
  --enable-expert-parallel --expert-placement 0,0,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
expect "--expert-placement: 'x' is not an expert number" "$k3" run -m "$model" -p hi -n 1 --tp 2 --enable-expert-parallel --expert-placement 1,x
# --nnodes: checked before anything starts, and a rendezvous that cannot happen ends within its timeout.
expect "--node-rank: expected 0..1 (--nnodes 2), got 2" "$k3" run -m "$model" -p hi -n 1 --tp 2 --nnodes 2 --node-rank 2
expect "--nnodes 2 needs --tensor-parallel-size" "$k3" run -m "$model" -p hi -n 1 --nnodes 2 --node-rank 1
expect "--master-port: expected 1..65535, got 0" "$k3" run -m "$model" -p hi -n 1 --tp 2 --nnodes 2 --master-port 0
expect "not under mpirun" "$mpiexec" -np 2 "$k3" run -m "$model" -p hi -n 1 --tp 2 --nnodes 2
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s)
expect "cannot reach the master (node 0) at 127.0.0.1:$port within 2 s: Connection refused" \
  env K3_RENDEZVOUS_TIMEOUT=2 "$k3" run -m "$model" -p hi -n 1 --tp 2 --nnodes 2 --node-rank 1 --master-port "$port"
expect "only 1 of 2 nodes joined on 127.0.0.1:$port within 2 s (missing node rank(s) 1)" \
  env K3_RENDEZVOUS_TIMEOUT=2 "$k3" run -m "$model" -p hi -n 1 --tp 2 --nnodes 2 --node-rank 0 --master-port "$port"
# Node 1 says --nnodes 3 to a node 0 of 2: both refuse, each with the reason.
K3_RENDEZVOUS_TIMEOUT=20 "$k3" run -m "$model" -p hi -n 1 --tp 3 --nnodes 3 --node-rank 1 --master-port "$port" \
  >/dev/null 2>"$tmp_err" &
node1=$!
expect "node 1 has --nnodes 3 but the master (node 0) has --nnodes 2" \
  env K3_RENDEZVOUS_TIMEOUT=20 "$k3" run -m "$model" -p hi -n 1 --tp 2 --nnodes 2 --node-rank 0 --master-port "$port"
wait $node1
rc=$?
if [ $rc -ne 1 ] || ! grep -qF "refused this node: node 1 has --nnodes 3 but the master (node 0) has --nnodes 2" "$tmp_err"; then
  echo "FAIL: node 1 of the mismatched rendezvous gave status $rc and: $(cat "$tmp_err")"
  fail=1
else
  echo "ok: node 1 told why"
fi
elapsed=$(( $(date +%s) - start ))
echo "bad rendezvous cases took $elapsed s"
[ $elapsed -lt 30 ] || { echo "FAIL: too slow ($elapsed s)"; fail=1; }
rm -f "$tmp_err"
exit $fail
