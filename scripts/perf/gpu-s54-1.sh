#!/bin/bash
# Session 54 call 1 (issue 18, an H200: the whole dummy Kimi-Linear-48B needs ~110 GB): s53-1's whole-model run failed
# (rc=1, stderr lost). Device memory sampled every 0.2 s beside each run ($OUT/smi-*.csv); stderr kept whole.
# (1) depth 0, b1 / 64 / 256 (s42-1's form: the targets' figures on today's code); (2) depth 512, b1 / 64 / 256 (s53-1's
# form; bench offline now rebuilds the depth caches per run where a second set does not fit); (3) one profiled b1 run
# (K3_CUDA_PROFILE: where the whole model's batch-1 step goes on the H200). Carry: .gpuwork/k3bins.tar.xz
BUDGET=560
. scripts/perf/lib-call.sh
kl_dummy_args
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
smi() { nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 200 > "$OUT/smi-$1.csv" & SMI=$!; }
peak() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; awk -F', ' '{v=$2+0; if (v>m) m=v} END {print "peak device memory " m " MiB"}' "$OUT/smi-$1.csv"; }
smi d0; timeout 200 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 0 -b 1,64,256 -r 2 > $OUT/kl-d0.txt 2>&1
echo "kl d0 rc=$? $(el)"; peak d0; grep -vE "^\s*$|^\| tg|^\| test|^\| ---" $OUT/kl-d0.txt | tail -12
[ $(left) -gt 150 ] && { smi d512; timeout 220 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 512 -b 1,64,256 -r 2 > $OUT/kl-d512.txt 2>&1
  echo "kl d512 rc=$? $(el)"; peak d512; grep -vE "^\s*$|^\| tg|^\| test|^\| ---" $OUT/kl-d512.txt | tail -12; }
[ $(left) -gt 60 ] && { K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 60 $D/k3 bench offline $KL --mem-bw -1 -p 0 -n 16 -b 1 -r 1 > $OUT/kl-prof-b1.txt 2>&1
  echo "prof b1 rc=$? $(el)"; grep -vE "^\s*$" $OUT/kl-prof-b1.txt | head -40; }
echo "done $(el)"
