#!/bin/bash
# Session 45 call 1. GPU (issue 18): session 44's planned call 4 (scripts/perf/gpu-s44-3.sh: the whole CUDA suite on main
# -- the session-42 rework without its bf16 GEMV, plus the vector-RMSNorm load dedup -- then k3old (session 41's CUDA
# code, scripts/gpu-pack-ab 3dad5ee) vs k3, alternating, Kimi-Linear-48B dummy decode b1 x3, b8 / b64 / b256 x2, and an
# ncu step split at b1). CPU (issue 15), on the host's cores after the GPU part: kl-1b (random weights of the template
# of /work/gate/kl-1b) quantised by k3 to Q4_K_M, the SAME file in k3 (Q4_K decode copies on / off) and llama.cpp
# 0c1e570 (CPU build, in the background during the GPU suite), decode tg128 at 16 threads, three alternating rounds,
# against `k3 bench memory -t 16` taken in each round and the file's bytes per token (scripts/peer/gguf_token_bytes.py).
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 3dad5ee) .gpuwork/kl.tpl.json.xz (scripts/random_checkpoint.py template
# /work/gate/kl-1b, xz) .gpuwork/llama-cpu-slim.tar.xz (scripts/peer/pack-llama-slim)
. scripts/perf/lib-call.sh
lscpu | grep -E 'Model name|^CPU\(s\)'
# --- CPU preparation in the background (llama.cpp's llama-bench; the checkpoint and k3's Q4_K_M of it)
. scripts/perf/lib-cpu-peer.sh
peer_kl1b_prep_during_suite  # the CPU preparation in the background while the whole CUDA suite runs
for r in 1 2 3; do for v in old new nopdl; do BIN=$D/k3; [ $v = old ] && BIN=$D/k3old; P=1; [ $v = nopdl ] && P=0
  K3_PDL=$P timeout 60 $BIN bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b1.txt
for b in 8 64 256; do for v in old new; do BIN=$D/k3; [ $v = old ] && BIN=$D/k3old
  timeout 60 $BIN bench offline $KL -p 0 -n 32 -b $b -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b$b rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-b8-256.txt
echo "gpu ab done $(el)"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do [ $(left) -gt 250 ] || break
  timeout 90 $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --log-file /tmp/ncu-n$n.csv $D/k3 bench offline $KL --enforce-eager -p 0 -n $n -b 1 -r 1 --mem-bw -1 > /tmp/ncu.out 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-n2.csv /tmp/ncu-n4.csv 4 > $OUT/ncu-b1-step.txt 2>&1; head -8 $OUT/ncu-b1-step.txt | cut -c1-150
# why the route (9.1 us a layer), the MoE down (1.76 TB/s) and gate/up kernels take what they take: one launch each
[ $(left) -gt 200 ] && timeout 90 $NCU --clock-control none --cache-control none -k regex:"route_warp|gemv_down_kernel|gemv_gate_up_kernel" \
  --launch-skip 6 --launch-count 3 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
  --section MemoryWorkloadAnalysis $D/k3 bench offline $KL --enforce-eager -p 0 -n 2 -b 1 -r 1 --mem-bw -1 > $OUT/ncu-moe-detail.txt 2>&1
echo "ncu detail rc=$? $(el)"; grep -E "route_warp|gemv_down|gemv_gate_up|Duration|Memory Throughput|Achieved Occupancy|Stall" $OUT/ncu-moe-detail.txt | head -30 | cut -c1-140
# --- CPU, 16 threads, the same GGUF in both engines
Q=/dev/shm/kl-q4km.gguf
python3 scripts/peer/gguf_token_bytes.py $Q | tee $OUT/cpu-t16.txt
for r in 1 2 3; do [ $(left) -gt 60 ] || break
  { echo "round $r: load $(cut -d' ' -f1-3 /proc/loadavg) $(el)"
    $D/k3 bench memory -t 16 2>&1 | tail -1
    for lay in 1 0; do
      K3_CPU_DECODE_LAYOUT=$lay timeout 40 $D/k3 bench offline -m $Q --no-mmap -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
      echo "k3 layout=$lay: $(grep -E '^\| kl-q4km' /tmp/e2e.txt | cut -d'|' -f3,6 | tr '\n' ' ')"
    done
    [ -x $LBIN/llama-bench ] && timeout 40 $LBIN/llama-bench -m $Q -mmp 0 -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
    echo "llama: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}')"; } 2>&1 | tee -a $OUT/cpu-t16.txt
done
[ $(left) -gt 30 ] && K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=8 timeout 25 $D/k3 bench offline -m $Q --no-mmap -p 0 -n 64 -r 1 -t 16 > $OUT/cpu-prof-t16.txt 2>&1
echo "done $(el)"
