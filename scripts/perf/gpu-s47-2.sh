#!/bin/bash
# Session 47 call 2 (issues 18 and 15). GPU: the bf16 MoE GEMV's down kernel as a stream of items -- the MoE and
# whole-model tests (the new same-bits test among them); CudaMoe.Timing at the Kimi-Linear shape, n = 1..16, the new
# form and K3_MOE_DOWN=items; the Kimi-Linear-48B dummy (12 layers on an H100) batch 1 three alternating rounds and
# batch 8 once, new vs K3_MOE_DOWN=items; ncu of both down kernels (three launches each, batch 1); the one-token GGUF
# projection chain timing (CudaPdl.TimingChainOfOneTokenProjections) as a baseline for later GEMV work. CPU (16
# threads, the 26.5 GB kl48 GGUF written while the GPU part runs): k3 with the KDA state / MLA kv_b prefetches against
# K3_KDA_STATE_PREFETCH=0 K3_MLA_PREFETCH=0, alternating, and one K3_CPU_PROFILE run. Carry: .gpuwork/k3bins.tar.xz
# (scripts/gpu-pack-bins) .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 200 $D/k3_cuda_tests --gtest_filter='CudaMoe.*:*CudaModel*:-*Timing*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]" $OUT/tests.log | head; xz -9 $OUT/tests.log
for v in stream items; do
  E=""; [ $v = items ] && E="K3_MOE_DOWN=items"
  env $E K3_MOE_TIMING_SHAPES=kl K3_MOE_TIMING_N=1,2,4,8,16 timeout 100 $D/k3_cuda_tests --gtest_filter='CudaMoe.Timing' > /tmp/t.log 2>&1
  echo "== timing $v rc=$? $(el)"; grep -iE "gemv" /tmp/t.log | head -12
done | tee $OUT/moe-timing.txt
kl_dummy_args
for r in 1 2 3; do [ $(left) -gt 200 ] || break; for v in stream items; do
  E=""; [ $v = items ] && E="K3_MOE_DOWN=items"
  env $E timeout 40 $D/k3 bench offline $KL -p 0 -n 64 -b 1 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b1 r$r rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done; done | tee $OUT/ab-kl-dummy.txt
for v in stream items; do [ $(left) -gt 180 ] || break
  E=""; [ $v = items ] && E="K3_MOE_DOWN=items"
  env $E timeout 30 $D/k3 bench offline $KL -p 0 -n 32 -b 8 -r 2 --mem-bw $BW > /tmp/tg.txt 2>&1; echo "$v b8 rc=$? $(grep -E '^\| kimi' /tmp/tg.txt | head -1)"
done | tee -a $OUT/ab-kl-dummy.txt
for v in stream items; do [ $(left) -gt 160 ] || break
  E=""; [ $v = items ] && E="K3_MOE_DOWN=items"
  env $E timeout 60 ncu --kernel-name regex:gemv_down --launch-skip 30 --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats \
    $D/k3 bench offline $KL -p 0 -n 4 -b 1 -r 1 > /tmp/ncu.txt 2>&1; echo "== ncu $v rc=$? $(el)"
  grep -E "gemv_down|Duration|DRAM Throughput|Memory Throughput|Registers|Achieved Occupancy|Waves" /tmp/ncu.txt | head -24
done | tee $OUT/ncu-down.txt
[ $(left) -gt 150 ] && { timeout 60 $D/k3_cuda_tests --gtest_filter='CudaPdl.TimingChainOfOneTokenProjections' > /tmp/c.log 2>&1; echo "chain rc=$?"; grep -E "us per projection|pdl" /tmp/c.log; } | tee $OUT/chain.txt
wait $QB; tail -1 /tmp/q48.log
for r in 1 2; do [ $(left) -gt 50 ] || break; for v in pf nopf; do
  E=""; [ $v = nopf ] && E="K3_KDA_STATE_PREFETCH=0 K3_MLA_PREFETCH=0"
  env $E timeout 60 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 2 -t 16 > /tmp/c.txt 2>&1; echo "$v r$r rc=$? $(grep -E 'memory read' /tmp/c.txt | tail -1 | grep -oE '[0-9.]+ GB/s') $(grep -E '^\| kl48' /tmp/c.txt)"
done; done | tee $OUT/cpu-t16-ab.txt
[ $(left) -gt 35 ] && K3_CPU_PROFILE=1 timeout 45 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof-t16.txt 2>&1
echo "done $(el)"
