#!/bin/bash
# Session 52 call 6: the two probes of s52-1 alone (an H100 came where s52-1 wants an H200): racecheck on
# mbarrier-ordered rounds (scripts/perf/probes/racecheck_mbarrier.cu) and the MLA copy path, cp.async warps against TMA
# tensor copies (scripts/perf/probes/mla_copy_paths.cu). Carry: .gpuwork/racecheck_mbarrier .gpuwork/mla_copy_paths.
set -u
GW=$PWD/.gpuwork
exec > >(tee "$OUT/stdout.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
for m in 0 1; do
  timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck $GW/racecheck_mbarrier $m > /tmp/rc.txt 2>&1
  echo "racecheck probe mode $m rc=$? $(grep -E 'mode|RACECHECK SUMMARY' /tmp/rc.txt | tr '\n' ' ')"
  head -c 3000 /tmp/rc.txt > $OUT/racecheck-probe-mode$m.txt
done
{ timeout 60 $GW/mla_copy_paths 64 8192; timeout 60 $GW/mla_copy_paths 8 32768; timeout 60 $GW/mla_copy_paths 256 1024; } 2>&1 | tee $OUT/mla-copy-paths.txt
