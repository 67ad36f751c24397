#!/bin/bash
# Session 60 call 2: what bounds the ring form -- ncu (speed of light, compute, warp states, memory, occupancy) of its
# gate+up and down launches at the K3 QAT bank's n = 4096 (bf16x2, the default); racecheck of the tiny shapes.
# Carry: .gpuwork/k3bins.tar.xz (scripts/gpu-pack-bins)
BUDGET=${BUDGET:-420}
. scripts/perf/lib-call.sh
K3_MOE_WGMMA=ring K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=4096 timeout 150 ncu --kernel-name regex:expert_ring --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section SchedulerStats \
  "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/ncu-ring.txt" 2>&1
echo "ncu rc=$? $(el)"; grep -E "expert_ring|Duration|Throughput|Pipe|Issue|Stall|Eligible|Active Warps|Registers|Shared Memory Config|Achieved Occ|Theoretical Occ|Warp Cycles" "$OUT/ncu-ring.txt" | head -90
timeout 240 /usr/local/cuda/bin/compute-sanitizer --tool racecheck "$D/k3_cuda_tests" --gtest_filter='CudaMoe.TinyShapes' > /tmp/cs.log 2>&1
echo "racecheck rc=$? $(el) $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')" | tee "$OUT/racecheck.txt"
echo "done $(el)"
