#!/bin/bash
# session 40 call 6 (issue 18): ncu of the cluster KDA decode kernel at batch 256 (CudaKda.Timing's third batch),
# to see what holds it at ~59% of an H100's bandwidth. Carry: .gpuwork/k3bins.tar.xz.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }
O=$OUT; P=s40-6; GW=$ROOT/.gpuwork; mkdir -p /tmp/k3b
nvidia-smi --query-gpu=name --format=csv,noheader
tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b; export LD_LIBRARY_PATH=/tmp/k3b:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T=/tmp/k3b/k3_cuda_tests; ulimit -c 0; export K3_SHARED_DIR=/nonexistent
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 300 $NCU --set full -k regex:kda_decode_fused --launch-skip 50 --launch-count 1 $T --gtest_filter='CudaKda.Timing' > $O/$P-ncu.txt 2>&1
echo "ncu rc=$? $(el)"
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per SM|Grid Size|Cluster|Warp Cycles Per Issued|Eligible Warps|Issued Warp|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|One or More|No Eligible|Stall" $O/$P-ncu.txt | head -60
xz -9 -k $O/$P-ncu.txt; echo "done $(el)"
