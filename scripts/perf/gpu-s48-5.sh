#!/bin/bash
# Session 48 call 5 (issues 15 / 18): the MXFP4 experts' GEMV path (moe_gemv.cu's quad kernels, K3_MOE_GEMV=2; the
# rule sends MXFP4 to the ring decode kernels) at batch 1 -- the kl48 Q4_K_M GGUF (MXFP4 routed experts) and a K3-dims
# dummy (6 layers), two alternating rounds each; ncu of the MoE kernels of both forms on the GGUF.
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 6"
env_ab 2 400 "k3 b1" ring "" gemv K3_MOE_GEMV=2 $K3A -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-k3.txt
env_ab 1 380 "k3 b2" ring "" gemv K3_MOE_GEMV=2 $K3A -p 0 -n 32 -d 512 -b 2 -r 2 | tee -a $OUT/ab-k3.txt
wait $QB; tail -1 /tmp/q48.log
env_ab 2 250 "gguf b1" ring "" gemv K3_MOE_GEMV=2 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1 -r 2 | tee $OUT/ab-gguf.txt
env_ab 1 220 "gguf b2" ring "" gemv K3_MOE_GEMV=2 -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 2 -r 2 | tee -a $OUT/ab-gguf.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for f in 1 2; do [ $(left) -gt 80 ] || break
  K3_MOE_GEMV=$f timeout 70 $NCU --kernel-name regex:"dec_ring|gemv_gate_up_mx|gemv_down_mx|dec_combine|plan_kernel|act_prep|glu_finish" --launch-skip 40 --launch-count 6 \
    --section SpeedOfLight $D/k3 bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 2 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu K3_MOE_GEMV=$f rc=$? $(el)"
  grep -E "^  [a-z_:<>, 0-9]*\(|Duration|DRAM Throughput" /tmp/ncu.txt | cut -c1-100 | head -24
done | tee $OUT/ncu-moe.txt
echo "done $(el)"
