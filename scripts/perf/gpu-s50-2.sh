#!/bin/bash
# Session 50 call 2: where the seesaw MLA kernel's time goes -- its compute-only (K3_MLA_SEESAW_PROBE=1: no copies) and
# load-only (=2: no MMAs) times beside the kernel, each with 0 / 1 / 2 tiles asked into L2 ahead by the producer warps
# (K3_MLA_SEESAW_L2AHEAD), at nh 96 / 8k / b64 and b256 and nh 32 / 8k / b64; the L2-ahead form against the CPU; then
# issue 15 on the host's 16 threads: the one-token MXFP4 rows' prefetch into L1 (the new default) against L2
# (K3_MXFP4_PREFETCH=t1, the old), the kl48 GGUF, alternating. Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
BUDGET=430
. scripts/perf/lib-call.sh
kl48_gguf_bg 8
for shape in 96,8192,64 32,8192,64 96,8192,256; do
  for probe in 0 1 2; do
    for ahead in 0 1 2; do
      r=$(K3_MLA_SEESAW_PROBE=$probe K3_MLA_SEESAW_L2AHEAD=$ahead K3_MLA_TIMING_DTYPE=bfloat16 K3_MLA_TIMING_ONLY=$shape timeout 30 \
          $D/k3_cuda_tests --gtest_filter='CudaMlaDecodeTiming.*' 2>&1 | grep timing | grep -oE "wgmma-2 +[0-9.]+ us|wgmma-1 +[0-9.]+ us" | tr '\n' ' ')
      echo "shape $shape probe $probe l2ahead $ahead: $r"
    done
  done
done | tee $OUT/seesaw-probes.txt
echo "probes done $(el)"
K3_MLA_SEESAW_L2AHEAD=1 timeout 60 $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.Wgmma*' > /tmp/l2a.log 2>&1
echo "l2ahead=1 tests rc=$? $(grep -E 'PASSED|FAILED' /tmp/l2a.log | head -3 | tr '\n' ' ')"; grep -E "wgmma-2.*nh= 96" /tmp/l2a.log | head -2
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
K3_MLA_WG=2 timeout 50 $CS --tool racecheck --racecheck-report hazard $D/k3_cuda_tests --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > /tmp/race.txt 2>&1
echo "racecheck rc=$? $(el)"; grep -B2 -A8 -m3 "Race reported\|Error: Race\|hazard" /tmp/race.txt | cut -c1-220 | head -40; head -c 200000 /tmp/race.txt | xz -9 > $OUT/racecheck.txt.xz
wait $QB; tail -1 /tmp/q48.log
CA="-m $G --no-mmap -p 0 -n 32 -r 1 -t 16"
ARM_TIMEOUT=60 env_ab 2 60 "cpu t16" t0 "" t1 "K3_MXFP4_PREFETCH=t1" $CA | tee $OUT/cpu-t16-ab.txt
[ $(left) -gt 40 ] && K3_CPU_PROFILE=1 timeout 40 $D/k3 bench offline $CA > /tmp/prof.txt 2>&1; grep -E "moe_experts|Q6_K|% of BW|kl48" /tmp/prof.txt | head -6 | tee $OUT/cpu-prof-t16.txt
echo "done $(el)"
