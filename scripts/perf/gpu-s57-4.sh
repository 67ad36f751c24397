#!/bin/bash
# Session 57 call 4: the whole CUDA suite with CUTLASS's grouped GEMMs as Auto's choice for BF16 banks (every test,
# not only the MoE / model suites), and where a Kimi-Linear-48B batch-1 decode step goes (61% of its roofline in s57-2):
# the eager path's profile with the warm-up skipped, beside the graphed figure.
# Carry: .gpuwork/k3bins.tar.xz
BUDGET=${BUDGET:-400}
. scripts/perf/lib-call.sh
timeout 230 "$D/k3_cuda_tests" --gtest_filter='-CudaMoe.Timing:CudaQuantMoe.Timing*:*Timing*' > "$OUT/suite.log" 2>&1
echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED  \]|tests ran" "$OUT/suite.log" | head -20
xz -9 "$OUT/suite.log"
kl_dummy_args
for e in "" "--enforce-eager"; do [ "$(left)" -gt 60 ] || break
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=2 timeout 100 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 512 -b 1 -r 2 $e > /tmp/p.txt 2>&1
  echo "kl b1 ${e:-graphs} rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi|rror" /tmp/p.txt
done 2>&1 | tee $OUT/kl-b1-profile.txt
echo "done $(el)"
