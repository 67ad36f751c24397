#!/bin/bash
# Session 48 call 4 (issues 18 and 15): the bf16 MoE down kernel's pairs form as the rule -- the MoE tests; the
# Kimi-Linear-48B dummy (12 layers) b1 / b8 / b64 / b256 against K3_MOE_DOWN=items; an nsys timeline of the b1 graph
# step (busy and idle time per kernel: scripts/perf/nsys_step_gaps.py); on the host's CPU, the kl48 Q4_K_M GGUF at 16
# threads with K3_CPU_PROFILE (where the step goes). Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz.
. scripts/perf/lib-call.sh
kl48_gguf_bg 12
timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMoe.*:CudaQuantModelQ8.*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED" $OUT/tests.log | head -10
kl_dummy_args
env_ab 2 330 "kl b1" pairs "" items K3_MOE_DOWN=items $KL -p 0 -n 64 -d 512 -b 1 -r 2 | tee $OUT/ab-kl.txt
for b in 8 64 256; do env_ab 1 300 "kl b$b" pairs "" items K3_MOE_DOWN=items $KL -p 0 -n 32 -d 512 -b $b -r 2; done | tee -a $OUT/ab-kl.txt
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
if [ -n "$NSYS" ]; then
  timeout 120 $NSYS profile -t cuda --cuda-graph-trace=node -o /tmp/s48 --force-overwrite true $D/k3 bench offline $KL -p 0 -n 16 -b 1 -r 1 > /tmp/nsys.out 2>&1
  echo "nsys rc=$? $(el)"; tail -3 /tmp/nsys.out
  timeout 90 $NSYS stats -r cuda_gpu_trace -f csv -o /tmp/s48tr /tmp/s48.nsys-rep > /tmp/nstats.out 2>&1; echo "stats rc=$? $(el)"; ls /tmp/s48tr* 2>/dev/null
  python3 scripts/perf/nsys_step_gaps.py /tmp/s48tr_cuda_gpu_trace.csv 4 2>&1 | head -45 | tee $OUT/nsys-b1-step.txt
fi
wait $QB; tail -1 /tmp/q48.log
[ $(left) -gt 70 ] && K3_CPU_PROFILE=1 timeout 60 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof-t16.txt 2>&1
tail -30 $OUT/cpu-prof-t16.txt | head -26
echo "done $(el)"
