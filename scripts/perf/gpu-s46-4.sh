#!/bin/bash
# Session 46 call 4 (issue 18): the whole CUDA suite on main's final code (the MoE decode's new combine / GLU finish ran
# only the CudaMoe tests in s46-3), then the Kimi-Linear-48B dummy at batch 1 / 8 / 64 / 256 for the targets table (an
# H100: its first 12 layers). Carry: .gpuwork/k3bins.tar.xz (gpu-pack-ab 9af1078: k3 = main)
. scripts/perf/lib-call.sh
cuda_suite
kl_dummy_args
for b in 1 8 64 256; do [ $(left) -gt 40 ] || break
  timeout 60 $D/k3 bench offline $KL -p 0 -n 32 -b $b -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "b$b rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done | tee $OUT/kl-dummy.txt
echo "done $(el)"
