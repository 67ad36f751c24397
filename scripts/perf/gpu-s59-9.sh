#!/bin/bash
# Session 59 call 9: the final code: the whole CUDA suite (200 s cap); ncu of the KL MoE layer's combine and GEMMs at
# bf16; pp4096 bf16 k3 vs k3old (3300da9: before the bf16 outputs) alternating on the 4-layer slice and the 12-layer KL48.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-ab 3300da9)
BUDGET=${BUDGET:-380}
. scripts/perf/lib-call.sh
cuda_suite
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 1 --gemm-precision bf16"
timeout 60 ncu --csv --kernel-name regex:"glu_rows|combine|device_kernel" --launch-count 4 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed "$D/k3" bench offline $KLS 2>/dev/null | grep -E "gpu__time|dram__" | awk -F'","' '{n=$5; sub(/\(.*/,"",n); print substr(n,1,60), $(NF-2), $NF}' | tee "$OUT/ncu.txt"
kl_dummy_args
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3 --gemm-precision bf16"
{ bin_ab 2 100 kl-4L-pp4096-bf16 $KLS
  ARM_TIMEOUT=60 bin_ab 2 30 kl48-pp4096-bf16 $KL -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16; } 2>&1 | tee "$OUT/ab.txt"
echo "done $(el)"
