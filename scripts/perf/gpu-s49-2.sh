#!/bin/bash
# Session 49 call 2 (issue 18): the MoE decode path's folded launches (moe_decode.h moe_dec_fold_enabled: x converted
# while the gate/up kernel stages it, the GLU applied while the down kernel stages h, up to 32 pairs) -- the whole
# CUDA suite with it as the default (CudaMoe.DecodeFoldGivesTheSameBits new), then alternating A/B against
# K3_MOE_DEC_FOLD=0 on the kl48 Q4_K_M GGUF (MXFP4 experts) b1 / b8 and the K3-dims dummy (3 layers) b1 / b8 / b64,
# one arm with K3_MOE_DEC_BLOCKS_PER_SM=1 on top; ncu of the folded path at b1.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 8
cuda_suite
xz -dc $OUT/suite.log.xz | grep -E "folded vs launches" | awk '{s+=$(NF-4)} END {print "fold lines", NR, "differing floats", s}'
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 3"
env_ab 2 330 "k3 b1" fold "" launches K3_MOE_DEC_FOLD=0 $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
env_ab 1 300 "k3 b8" fold "" launches K3_MOE_DEC_FOLD=0 $K3A -p 0 -n 32 -d 512 -b 8 -r 2 | tee -a $OUT/ab-k3.txt
env_ab 1 280 "k3 b64" fold "" launches K3_MOE_DEC_FOLD=0 $K3A -p 0 -n 32 -d 512 -b 64 -r 2 | tee -a $OUT/ab-k3.txt
wait $QB; tail -1 /tmp/q48.log
GA="-m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512"
env_ab 3 170 "gguf b1" fold "" launches K3_MOE_DEC_FOLD=0 $GA -b 1 -r 2 | tee $OUT/ab-gguf.txt
env_ab 1 120 "gguf b1" fold "" fold+bps1 K3_MOE_DEC_BLOCKS_PER_SM=1 $GA -b 1 -r 2 | tee -a $OUT/ab-gguf.txt
env_ab 1 90 "gguf b8" fold "" launches K3_MOE_DEC_FOLD=0 $GA -b 8 -r 2 | tee -a $OUT/ab-gguf.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ $(left) -gt 60 ] && timeout 55 $NCU --kernel-name regex:"dec_ring|dec_combine|plan_kernel" --launch-skip 40 --launch-count 4 \
    --section SpeedOfLight $D/k3 bench offline $GA -n 2 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu rc=$? $(el)"
grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput" /tmp/ncu.txt | cut -c1-100 | head -16 | tee $OUT/ncu-fold.txt
echo "done $(el)"
