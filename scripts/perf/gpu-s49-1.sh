#!/bin/bash
# Session 49 call 1 (issue 18): the MXFP4 ring decode kernels' K split at batch 1-64. The split is chosen for
# dec_kernel's row blocks (2 per SM aimed at), but the ring kernel has twice the row blocks, so at batch 1 it runs
# ~1.6 waves of 2-chunk blocks (kl48: 648 blocks, 3 a SM). K3_MOE_DEC_BLOCKS_PER_SM=1 halves the split (one wave of
# 4-chunk blocks; both kernels keep the same bits as each other). Alternating A/B on the kl48 Q4_K_M GGUF (MXFP4
# experts) b1 / b8 and the K3-dims dummy (3 layers) b1 / b8 / b64; ncu of the ring path at b1 with the knob at 1.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 3"
env_ab 2 420 "k3 b1" bps2 "" bps1 K3_MOE_DEC_BLOCKS_PER_SM=1 $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
env_ab 1 400 "k3 b8" bps2 "" bps1 K3_MOE_DEC_BLOCKS_PER_SM=1 $K3A -p 0 -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-k3.txt
env_ab 1 380 "k3 b64" bps2 "" bps1 K3_MOE_DEC_BLOCKS_PER_SM=1 $K3A -p 0 -n 32 -d 512 -b 64 -r 2 | tee -a $OUT/ab-k3.txt
wait $QB; tail -1 /tmp/q48.log
env_ab 3 250 "gguf b1" bps2 "" bps1 K3_MOE_DEC_BLOCKS_PER_SM=1 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
env_ab 1 200 "gguf b1" bps2 "" bps3 K3_MOE_DEC_BLOCKS_PER_SM=3 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee -a $OUT/ab-gguf.txt
env_ab 1 180 "gguf b8" bps2 "" bps1 K3_MOE_DEC_BLOCKS_PER_SM=1 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-gguf.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for f in 2 1; do [ $(left) -gt 75 ] || break
  K3_MOE_DEC_BLOCKS_PER_SM=$f timeout 65 $NCU --kernel-name regex:"dec_ring|dec_combine|plan_kernel|act_prep|glu_finish" --launch-skip 40 --launch-count 6 \
    --section SpeedOfLight $D/k3 bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 2 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu bps=$f rc=$? $(el)"
  grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput" /tmp/ncu.txt | cut -c1-100 | head -24
done | tee $OUT/ncu-ring.txt
echo "done $(el)"
