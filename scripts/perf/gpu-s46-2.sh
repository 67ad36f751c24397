#!/bin/bash
# Session 46 call 2 (issues 15 and 18), on one 26.5 GB GGUF at Kimi-Linear-48B's true dimensions (all 27 layers, k3's
# Q4_K_M with MXFP4 routed experts; written on the host by `k3 quantize --load-format dummy`, now with the
# kimi-linear.context_length llama.cpp needs): the host's 16-thread decode, k3 against llama.cpp 0c1e570 (CPU build from
# the slim source), two alternating rounds; k3's GPU batch-1 step by op category (K3_CUDA_PROFILE=1, eager), and an ncu
# step split of it (the decode's kernels at 18% of the H100's bandwidth in s46-1). While the GGUF is written: the route
# kernel's block form against the warp form end to end (K3_ROUTE_FORM=warp), Kimi-Linear-48B dummy b1, three rounds.
# (llama.cpp's CUDA build is call s46-3's: its dev-box prebuild was not done.)
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/llama-cpu-slim.tar.xz .gpuwork/tiktoken.model.xz
. scripts/perf/lib-call.sh
. scripts/perf/lib-cpu-peer.sh
peer_llama_slim_bg
kl48_gguf_bg 6
kl_dummy_args
for r in 1 2 3; do for F in block warp; do
  E=""; [ $F = warp ] && E=warp
  K3_ROUTE_FORM=$E timeout 60 $D/k3 bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "route=$F b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/route-ab-b1.txt
wait $LB $QB; tail -1 /tmp/llama-build.log; tail -3 /tmp/q48.log; echo "cpu prep done $(el)"
peer_gguf_rounds_t16 $G 300
[ $(left) -gt 60 ] && K3_CUDA_PROFILE=1 timeout 60 $D/k3 bench offline -m $G --device cuda --enforce-eager -p 0 -n 16 -b 1 -r 1 > $OUT/gpu-prof-b1.txt 2>&1
echo "prof rc=$? $(el)"; grep -vE "^\s*$" $OUT/gpu-prof-b1.txt | tail -30
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for n in 2 4; do [ $(left) -gt 100 ] || break
  timeout $(( $(left) - 40 )) $NCU --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --log-file /tmp/ncu-n$n.csv $D/k3 bench offline -m $G --device cuda --enforce-eager -p 0 -n $n -b 1 -r 1 > /tmp/ncu.out 2>&1
  echo "ncu n=$n rc=$? $(el)"
done
python3 scripts/perf/ncu_step_diff.py /tmp/ncu-n2.csv /tmp/ncu-n4.csv 2 > $OUT/ncu-b1-step.txt 2>&1; head -30 $OUT/ncu-b1-step.txt | cut -c1-160
echo "done $(el)"
