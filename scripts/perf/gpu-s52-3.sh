#!/bin/bash
# Session 52 call 3 (issue 18 item 3): why neither tiling of the wgmma MLA decode kernel moves at nh 96 (s52-2: 32-key
# tiles in four stages 0.98x at nh 96 / 8k / b64, 431.7 us on an H100 where an H200 took 428.9 in s50-1: not bound by
# HBM). ncu of one launch of each tiling at nh 96 / 8k / b64 (speed of light, compute and memory workload, warp
# states, launch stats) and the per-SASS-line stall samples of the 64-key kernel (csv); racecheck's first hazards
# for both tilings (s52-2's racecheck printed 52 on the 32-key kernel: are they the 64-key kernel's too, and where).
# Carry: .gpuwork/k3bins.tar.xz.
BUDGET=400
. scripts/perf/lib-call.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
export K3_MLA_TIMING_DTYPE=bfloat16 K3_MLA_TIMING_ONLY=96,8192,64
F="--gtest_filter=CudaMlaDecodeTiming.*"
for tile in 64 32; do
  K3_MLA_WG_TILE=$tile timeout 120 $NCU --kernel-name regex:"attend_seesaw" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section LaunchStats --section Occupancy --print-units base $D/k3_cuda_tests $F > $OUT/ncu-tile$tile.txt 2>&1
  echo "ncu tile $tile rc=$? $(el)"
done
[ $(left) -gt 200 ] && timeout 150 $NCU --kernel-name regex:"attend_seesaw" --launch-skip 3 --launch-count 1 --section WarpStateStats \
    --section SourceCounters --print-units base --page source --csv $D/k3_cuda_tests $F > $OUT/ncu-src-tile64.csv 2>/dev/null
echo "src rc=$? $(el)"; xz -9 $OUT/ncu-src-tile64.csv
unset K3_MLA_TIMING_ONLY
CS=/usr/local/cuda/bin/compute-sanitizer
for tile in 64 32; do
  [ $(left) -gt 60 ] || break
  K3_MLA_WG_TILE=$tile timeout 60 $CS --tool racecheck --print-limit 6 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > $OUT/racecheck-tile$tile.txt 2>&1
  echo "racecheck tile $tile rc=$? $(el) $(grep -E 'RACECHECK SUMMARY' $OUT/racecheck-tile$tile.txt)"
done
echo "done $(el)"
