#!/bin/bash
# Session 55 call 1 (session 54's unrun s54-4, with the W4A8 prototype in front): scripts/perf/w4a8_bench.cu (carried
# built: .gpuwork/w4a8_bench) -- its correctness check, then its K3-shape timing at n = 1 / 8 / 64 (~1 min). Then
# s54-1 and the pool A/B planned as s54-3 (never ran alone) in one call (device time is short: most starts are refused). On a card of 100+ GB
# (an H200) first the whole dummy Kimi-Linear-48B (s54-1, trimmed: depth 0 b1 / 64 / 256; depth 512 b256 -- s53-1's
# failing case, now with the per-run rebuild; one profiled b1 step), device memory sampled beside each; then on the host
# CPU the pool's hand-out A/B (s54-3, trimmed to two decode rounds). Carry: .gpuwork/k3bins.tar.xz (k3, and
# k3_cuda_tests for the W4A8 tests) .gpuwork/tiktoken.model.xz .gpuwork/w4a8_bench
BUDGET=${BUDGET:-585}
. scripts/perf/lib-call.sh
timeout 60 $GW/w4a8_bench check > $OUT/w4a8-check.txt 2>&1; echo "w4a8 check rc=$? $(el)"; cat $OUT/w4a8-check.txt
for n in 1 8 64; do timeout 40 $GW/w4a8_bench time $n 10; echo "w4a8 time n=$n rc=$? $(el)"; done 2>&1 | tee $OUT/w4a8-time.txt
if [ -x $D/k3_cuda_tests ]; then  # the W4A8 path's and the device MXFP8 quantiser's tests (when the pack has the test binary)
  timeout 150 $D/k3_cuda_tests --gtest_filter='CudaMxfp8.*:CudaMoe.W4a8MatchesCpuMxfp8' > $OUT/w4a8-tests.log 2>&1
  echo "w4a8 tests rc=$? $(el)"; grep -E "^\[ (w4a8|mxfp8) \]|FAILED|PASSED|Failure|error" $OUT/w4a8-tests.log | head -30
fi
kl_dummy_args
smi() { nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 200 > "$OUT/smi-$1.csv" & SMI=$!; }
peak() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; awk -F', ' '{v=$2+0; if (v>m) m=v} END {print "peak device memory " m " MiB"}' "$OUT/smi-$1.csv"; }
if [ "$BW" = 4175 ]; then
  smi d0; timeout 150 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 0 -b 1,64,256 -r 2 > $OUT/kl-d0.txt 2>&1
  echo "kl d0 rc=$? $(el)"; peak d0; grep -E "^\| kimi|rror|memory" $OUT/kl-d0.txt | head -8
  smi d512; timeout 150 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 512 -b 256 -r 1 > $OUT/kl-d512.txt 2>&1
  echo "kl d512 b256 rc=$? $(el)"; peak d512; grep -E "^\| kimi|rror|memory|rebuild" $OUT/kl-d512.txt | head -8
  K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 timeout 50 $D/k3 bench offline $KL --mem-bw -1 -p 0 -n 16 -b 1 -r 1 > $OUT/kl-prof-b1.txt 2>&1
  echo "prof b1 rc=$? $(el)"; grep -vE "^\s*$" $OUT/kl-prof-b1.txt | head -36
fi
kl48_gguf_bg 16
wait $QB; tail -1 /tmp/q48.log; echo "gguf done $(el)"; lscpu | grep -E "Model name"
for r in 1 2; do for c in inorder spread; do
  echo "claim=$c r$r $(el)"
  K3_POOL_CLAIM=$c timeout 40 $D/k3 bench memory --passes 10 --job-kib 64,256,704,1024,2048,5184,16384 -t 16 2>&1
done; done 2>&1 | tee $OUT/cpu-jobs.txt
for r in 1 2 3; do for c in inorder spread; do [ $(left) -gt 75 ] || break
  K3_POOL_CLAIM=$c timeout 60 $D/k3 bench offline -m $G --no-mmap -p 0 -n 64 -r 2 -t 16 > /tmp/k.txt 2>&1
  echo "k3 claim=$c r$r rc=$? $(el) $(grep -E '^\| kl48' /tmp/k.txt) $(grep -oE 'bandwidth [0-9.]+ GB/s' /tmp/k.txt | tr '\n' ' ')"
done; done 2>&1 | tee $OUT/cpu-t16.txt
for c in spread inorder; do [ $(left) -gt 30 ] || break
  K3_POOL_CLAIM=$c K3_CPU_PROFILE=1 timeout 40 $D/k3 bench offline -m $G --no-mmap -p 0 -n 32 -r 1 -t 16 > $OUT/cpu-prof-$c.txt 2>&1
  echo "profile $c rc=$? $(el)"; sed -n '/cpu profile/,/weights streamed/p' $OUT/cpu-prof-$c.txt | head -16; grep -E "^\| kl48" $OUT/cpu-prof-$c.txt
done
echo "done $(el)"
