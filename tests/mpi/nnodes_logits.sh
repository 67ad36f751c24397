#!/bin/sh
# Two processes as two "hosts" on 127.0.0.1 (--nnodes 2, the TCP rendezvous + ompi-server): the sharded
# logits equal one process's (k3_tp_check compares on node 0). Node 1 starts first: it must wait for
# node 0 rather than fail.
# usage: nnodes_logits.sh K3_TP_CHECK MODEL [flags...]
set -u
check=$1 model=$2
shift 2
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$check" "$model" --nnodes 2 --node-rank 1 --master-port "$port" "$@" &
node1=$!
sleep 0.5
timeout 100 "$check" "$model" --nnodes 2 --node-rank 0 --master-port "$port" "$@"
rc0=$?
wait $node1
rc1=$?
echo "node 0: status $rc0, node 1: status $rc1"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
