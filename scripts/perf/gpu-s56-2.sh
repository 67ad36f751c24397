#!/bin/bash
# Session 56 call 2: s56-1 trimmed to what ~4 minutes of device time allow (most starts were refused this session):
# the new and refactored MoE tests, CudaMoe.Timing (K3 QAT: w4a8 vs auto dec), w4a8_bench check + time (the tiled
# layout beside the others), k3-tiny perplexity float32 vs mxfp8, the 4-layer K3 slice decode float32 vs mxfp8; ncu
# of the two n = 8 gate|up forms only if time is left. Carry: as s56-1.
BUDGET=${BUDGET:-240}
. scripts/perf/lib-call.sh
F='CudaMxfp8.*:CudaMoe.W4a8MatchesCpuMxfp8:CudaMoe.Mxfp8TilesMatchCpuMxfp8:CudaModelE2E.Mxfp8MatchesCpuMxfp8:CudaModelE2E.PrefillMatchesCpu'
F="$F:CudaMoe.TinyShapes:CudaMoe.KimiLinearShape:CudaQuantMoe.TensorCoreTilesMatchAFloat64MoeForEveryFormat"
moe_tests_and_timing 120 "$F"
timeout 40 $GW/w4a8_bench check > $OUT/w4a8-check.txt 2>&1; echo "w4a8 check rc=$? $(el)"; grep -E "alayout=3|order" $OUT/w4a8-check.txt
for n in 8 64 1; do [ "$(left)" -gt 90 ] || break; timeout 30 $GW/w4a8_bench time $n 6; echo "w4a8 time n=$n rc=$? $(el)"; done > $OUT/w4a8-time.txt 2>&1
grep -E "^n=|splits=1:|rc=" $OUT/w4a8-time.txt
kl_dummy_args
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 --mem-bw $BW"
for a in float32 mxfp8; do [ "$(left)" -gt 50 ] || break
  timeout 45 $D/k3 bench offline $K3A --moe-activation-dtype $a -p 0 -n 32 -b 1,8,64 -r 2 > /tmp/b.txt 2>&1
  echo "k3s4 decode $a rc=$? $(el)"; grep -E "^\| kimi|rror" /tmp/b.txt
done 2>&1 | tee $OUT/k3s4-act.txt
for a in float32 mxfp8; do [ "$(left)" -gt 30 ] || break
  timeout 25 $D/k3 perplexity -m models/k3-tiny --device cuda --ctx 512 -f $GW/persuasion-60k.txt --moe-activation-dtype $a > $OUT/ppl-$a.txt 2>&1
  echo "ppl $a rc=$? $(el) $(grep -iE 'ppl|perplexity' $OUT/ppl-$a.txt | tail -2 | tr '\n' ' ')"
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in "0 base" "54 tiled"; do set -- $v; [ "$(left)" -gt 50 ] || break
  timeout $(( $(left) - 15 )) $NCU --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
    -k regex:w4a8_kernel --launch-skip $1 -c 1 $GW/w4a8_bench time 8 1 > $OUT/ncu-$2.txt 2>&1
  echo "ncu $2 rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued" $OUT/ncu-$2.txt | head -14
done
echo "done $(el)"
