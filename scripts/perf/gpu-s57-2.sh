#!/bin/bash
# Session 57 call 2 (on the warm machine right after call 1): the whole Kimi-Linear-48B dummy (an H200 holds it) at
# pp4096 with K3_MOE_CUTLASS 0 / 1 alternating and its decode b1 / 64 / 256 (never run since s53's failure); then
# ncu of the W4A8 prototype's n = 8 gate|up launch, base and tiled layouts (session 56's plan).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/w4a8_bench
BUDGET=${BUDGET:-400}
. scripts/perf/lib-call.sh
kl_dummy_args
smi() { nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 200 > "$OUT/smi-$1.csv" & SMI=$!; }
peak() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; awk -F', ' '{v=$2+0; if (v>m) m=v} END {print "peak device memory " m " MiB"}' "$OUT/smi-$1.csv"; }
if [ "$BW" = 4175 ]; then
  ARM_TIMEOUT=90 env_ab 2 150 kl48-pp4096 tiles "K3_MOE_CUTLASS=0" cutlass "K3_MOE_CUTLASS=1" $KL -p 4096 -n 0 -b 1 -r 2 2>&1 | tee $OUT/kl48-pp.txt
  smi d0; timeout 120 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 0 -b 1,64,256 -r 2 > $OUT/kl-d0.txt 2>&1
  echo "kl d0 rc=$? $(el)"; peak d0; grep -E "^\| kimi|rror|memory" $OUT/kl-d0.txt | head -8
fi
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ "$(left)" -gt 100 ] && timeout 90 $NCU --set full --import-source no -k regex:w4a8_kernel -c 2 -o $OUT/w4a8-n8 $GW/w4a8_bench time 8 1 > $OUT/ncu-run.txt 2>&1
echo "ncu rc=$? $(el)"
[ -f $OUT/w4a8-n8.ncu-rep ] && $NCU -i $OUT/w4a8-n8.ncu-rep --page details > $OUT/ncu-details.txt 2>&1 &&
  grep -E "w4a8_kernel|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible|L2 Hit" $OUT/ncu-details.txt | head -24
[ "$(left)" -gt 70 ] && timeout $(( $(left) - 10 )) $NCU --set full --import-source no -k regex:w4a8_kernel --launch-skip 54 -c 1 -o $OUT/w4a8-n8-tiled $GW/w4a8_bench time 8 1 > $OUT/ncu-run-tiled.txt 2>&1
echo "ncu tiled rc=$? $(el)"
[ -f $OUT/w4a8-n8-tiled.ncu-rep ] && $NCU -i $OUT/w4a8-n8-tiled.ncu-rep --page details > $OUT/ncu-details-tiled.txt 2>&1 &&
  grep -E "w4a8_kernel|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible" $OUT/ncu-details-tiled.txt | head -12
echo "done $(el)"
