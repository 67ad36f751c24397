#!/bin/bash
# Session 50 call 1 (issue 18 item 3): the seesaw MLA decode kernel (sm90a/mla_decode_seesaw.cu) -- its tests first
# (both wgmma kernels against the CPU), then the whole CUDA suite (also the first GPU run of session 49's env_flag.h /
# moe_dec_folds_glu assertions), the SASS of the new kernel, memcheck / racecheck / synccheck of the wgmma tests,
# the kernel timing table (BF16 rows: mma.sync, seesaw, the first wgmma kernel), the K3-dims slice at depth 8192.
# Carry: .gpuwork/k3bins.tar.xz.
BUDGET=580
. scripts/perf/lib-call.sh
timeout 120 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.Wgmma*' > $OUT/mla-wg-tests.log 2>&1
MRC=$?; echo "mla wgmma tests rc=$MRC $(el)"; grep -E "wgmma|FAILED|PASSED" $OUT/mla-wg-tests.log | head -50
if [ $MRC -eq 0 ]; then
  cuda_suite
else
  timeout 200 $D/k3_cuda_tests --gtest_filter='-CudaMlaDecode.Wgmma*' > $OUT/suite.log 2>&1
  echo "suite (without the wgmma MLA tests) rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) " $OUT/suite.log | head; xz -9 $OUT/suite.log
fi
xz -dc $OUT/suite.log.xz | grep -E "folded vs launches" | awk '{s+=$(NF-4)} END {print "fold lines", NR, "differing floats", s}'
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CUOBJ -sass $D/k3_cuda_tests 2>/dev/null | awk '/Function : .*attend_seesaw/{p=1} /Function : /{if(!/attend_seesaw/)p=0} p' > /tmp/seesaw.sass
echo "sass lines $(wc -l < /tmp/seesaw.sass) HGMMA $(grep -c HGMMA /tmp/seesaw.sass) SETMAXREG $(grep -c SETMAXREG /tmp/seesaw.sass) WARPGROUP $(grep -c WARPGROUP /tmp/seesaw.sass) LDL/STL $(grep -cE 'LDL|STL' /tmp/seesaw.sass)"
xz -9c /tmp/seesaw.sass > $OUT/seesaw-sass.txt.xz
if [ $MRC -eq 0 ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck synccheck; do
    [ $(left) -gt 300 ] || break
    timeout 60 $CS --tool $tool $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > /tmp/cs-$tool.txt 2>&1
    echo "== $tool rc=$? $(el): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' /tmp/cs-$tool.txt | head -2 | tr '\n' ' ')"
    tail -5 /tmp/cs-$tool.txt >> $OUT/sanitizers.txt
  done
  K3_MLA_TIMING_DTYPE=bfloat16 timeout $(( $(left) - 130 )) $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' > $OUT/mla-timing.log 2>&1
  echo "timing rc=$? $(el)"; grep timing $OUT/mla-timing.log | sed 's/^\[ timing \] mla decode //' | cut -c1-400
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  [ $(left) -gt 200 ] && K3_MLA_TIMING_DTYPE=bfloat16 K3_MLA_TIMING_ONLY=96,8192,64 timeout 80 $NCU --kernel-name regex:"attend_seesaw|attend_wg" \
      --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
      $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' > $OUT/ncu-seesaw.txt 2>&1; echo "== ncu rc=$? $(el)"
  grep -E "attend_|Duration|DRAM Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|L2 Hit" $OUT/ncu-seesaw.txt | cut -c1-110 | head -30
  K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 --kv-cache-dtype bf16 -p 0 -n 16 -d 8192 -r 1"
  ARM_TIMEOUT=60 env_ab 1 70 "k3x4 d8k b64" seesaw "K3_MLA_WG=2" first "K3_MLA_WG=1" $K3A -b 64 | tee $OUT/ab-k3.txt
  ARM_TIMEOUT=50 env_ab 1 60 "k3x4 d8k b8" seesaw "K3_MLA_WG=2" first "K3_MLA_WG=1" $K3A -b 8 | tee -a $OUT/ab-k3.txt
fi
echo "done $(el)"
