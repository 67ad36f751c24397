#!/bin/bash
# Session 56 call 1: --moe-activation-dtype mxfp8 on the GPU end to end, the W4A8 kernels' same-call A/B and profile.
# 1. the CUDA suite without the timings (the MoE launchers were refactored for the MXFP8 tile form): among them
#    CudaMxfp8.* (the device fake quantiser bit for bit), CudaMoe.W4a8MatchesCpuMxfp8 (1.5e-2), CudaMoe.Mxfp8Tiles*,
#    CudaModelE2E.Mxfp8MatchesCpuMxfp8 (three checkpoints, prefill and decode);
# 2. CudaMoe.Timing, K3 QAT bank, n = 1 / 8 / 64: the engine's w4a8 row against "auto dec" in one process;
# 3. k3-tiny perplexity on the GPU, float32 vs mxfp8 activations (the CPU's figures: docs/quantization.md), and
#    the 4-layer dummy K3 slice, decode b1 / 8 / 64 and pp2048, float32 vs mxfp8 alternating;
# 4. w4a8_bench check + time (a tiled weight layout added: each warp's chunk one contiguous 1 KB) and ncu (full set)
#    of its n = 8 gate|up and down launches (what holds it at ~62% of HBM) and of the tiled form's gate|up;
# 5. on a 100+ GB card only: the whole dummy Kimi-Linear-48B, depth 0 b1 / 64 / 256 (never run since s53).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/w4a8_bench .gpuwork/persuasion-60k.txt
BUDGET=${BUDGET:-585}
. scripts/perf/lib-call.sh
# (SUITE=all: every test; default: the suites the refactored MoE launchers and the new form touch)
F='CudaMxfp8.*:CudaMoe.*:CudaQuantMoe.*:CudaModelE2E.*:CudaQuantModel.*:-CudaMoe.Timing:CudaQuantMoe.Timing*'
[ "${SUITE:-}" = all ] && F='-CudaMoe.Timing:CudaQuantMoe.Timing*'
moe_tests_and_timing 230 "$F"
timeout 60 $GW/w4a8_bench check > $OUT/w4a8-check.txt 2>&1; echo "w4a8 check rc=$? $(el)"; grep -E "tiled|alayout=3|order" $OUT/w4a8-check.txt
for n in 1 8 64; do timeout 40 $GW/w4a8_bench time $n 10; echo "w4a8 time n=$n rc=$? $(el)"; done > $OUT/w4a8-time.txt 2>&1
grep -E "^n=|splits=1:|rc=" $OUT/w4a8-time.txt
for a in float32 mxfp8; do
  timeout 60 $D/k3 perplexity -m models/k3-tiny --device cuda --ctx 512 -f $GW/persuasion-60k.txt --moe-activation-dtype $a > $OUT/ppl-$a.txt 2>&1
  echo "ppl $a rc=$? $(el) $(grep -iE 'ppl|perplexity' $OUT/ppl-$a.txt | tail -2 | tr '\n' ' ')"
done
timeout 30 $D/k3 run -m models/k3-tiny --device cuda --moe-activation-dtype mxfp8 -p "It is a truth universally" -n 24 2>&1 | tail -3
kl_dummy_args
K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 --mem-bw $BW"
for r in 1 2; do for a in float32 mxfp8; do [ "$(left)" -gt $(( r == 1 ? 150 : 330 )) ] || break
  timeout 60 $D/k3 bench offline $K3A --moe-activation-dtype $a -p 0 -n 32 -b 1,8,64 -r 2 > /tmp/b.txt 2>&1
  echo "k3s4 decode $a r$r rc=$? $(el)"; grep -E "^\| kimi|rror" /tmp/b.txt
  timeout 40 $D/k3 bench offline $K3A --moe-activation-dtype $a -p 2048 -n 0 -b 1 -r 2 > /tmp/b.txt 2>&1
  echo "k3s4 pp2048 $a r$r rc=$? $(el)"; grep -E "^\| kimi|rror" /tmp/b.txt
done; done 2>&1 | tee $OUT/k3s4-act.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ "$(left)" -gt 100 ] && timeout $(( $(left) > 130 ? 120 : $(left) - 10 )) $NCU --set full --import-source no -k regex:w4a8_kernel -c 2 -o $OUT/w4a8-n8 $GW/w4a8_bench time 8 1 > $OUT/ncu-run.txt 2>&1
echo "ncu rc=$? $(el)"; tail -3 $OUT/ncu-run.txt
if [ -f $OUT/w4a8-n8.ncu-rep ]; then
  $NCU -i $OUT/w4a8-n8.ncu-rep --page details > $OUT/ncu-details.txt 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|Registers Per|Achieved Occupancy|Theoretical Occ|L2 Hit|Eligible|Active Warps|No Eligible" $OUT/ncu-details.txt | head -40
  $NCU -i $OUT/w4a8-n8.ncu-rep --page source --print-source sass --csv > $OUT/ncu-sass.csv 2>&1; echo "sass page rc=$? $(wc -l < $OUT/ncu-sass.csv) lines"
  $NCU -i $OUT/w4a8-n8.ncu-rep --page raw --csv > $OUT/ncu-raw.csv 2>&1
  xz -9 $OUT/ncu-sass.csv $OUT/ncu-raw.csv
fi
# the tiled layout's gate|up launch (config 10 of w4a8_bench: 9 forms x 3 splits x 2 stages launched before it)
[ "$(left)" -gt 80 ] && timeout $(( $(left) - 10 )) $NCU --set full --import-source no -k regex:w4a8_kernel --launch-skip 54 -c 1 -o $OUT/w4a8-n8-tiled $GW/w4a8_bench time 8 1 > $OUT/ncu-run-tiled.txt 2>&1
echo "ncu tiled rc=$? $(el)"
if [ -f $OUT/w4a8-n8-tiled.ncu-rep ]; then
  $NCU -i $OUT/w4a8-n8-tiled.ncu-rep --page details > $OUT/ncu-details-tiled.txt 2>&1
  grep -E "w4a8_kernel|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible" $OUT/ncu-details-tiled.txt | head -12
fi
smi() { nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 200 > "$OUT/smi-$1.csv" & SMI=$!; }
peak() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; awk -F', ' '{v=$2+0; if (v>m) m=v} END {print "peak device memory " m " MiB"}' "$OUT/smi-$1.csv"; }
if [ "$BW" = 4175 ] && [ "$(left)" -gt 170 ]; then
  smi d0; timeout $(( $(left) - 10 )) $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 0 -b 1,64,256 -r 2 > $OUT/kl-d0.txt 2>&1
  echo "kl d0 rc=$? $(el)"; peak d0; grep -E "^\| kimi|rror|memory" $OUT/kl-d0.txt | head -8
fi
if [ "$(left)" -gt 90 ]; then  # the new kernels under compute-sanitizer (the fake quantiser, the tile form's launches)
  timeout $(( $(left) - 15 )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $D/k3_cuda_tests \
    --gtest_filter='CudaMxfp8.*:CudaMoe.Mxfp8TilesMatchCpuMxfp8' > $OUT/memcheck.log 2>&1
  echo "memcheck rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
fi
echo "done $(el)"
