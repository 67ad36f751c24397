#!/bin/bash
# session 21 call 2: the ring MXFP4 decode kernel (the default now) on the H200: bitwise + MoE tests, model tests,
# kernel timing reg / ring / ring4, dummy K3-slice decode A/B; then the hybrid overlap A/B (issue 14)
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 570 - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork; BD=/tmp/bd; mkdir -p $BD
mkdir -p /tmp/k3b && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; M=$BD/k3fr; G=$BD/k3fr.gguf
( xz -dc $GW/llama/k3-1b-fr.tpl.json.xz > /tmp/k3fr.tpl.json && nice python3 scripts/random_checkpoint.py write /tmp/k3fr.tpl.json $M > /tmp/ckpt.log 2>&1 && $B convert -m $M -o $G > /tmp/conv.log 2>&1; echo "ckpt+gguf rc=$?" ) &
CK=$!
$T --gtest_filter='CudaMoe.*:CudaQuantMoe.*:-*Timing*' > $O/s21-2-moe-tests.log 2>&1; echo "moe tests rc=$? $(el)"
grep -E "^\[  (FAILED|PASSED)" $O/s21-2-moe-tests.log | head -12; echo "bitwise lines with 0 differing: $(grep -c ' 0 of ' $O/s21-2-moe-tests.log), other: $(grep 'floats differ' $O/s21-2-moe-tests.log | grep -vc ' 0 of ')"
$T --gtest_filter='Tiny/CudaModelE2E.*:Presets/CudaQuantModel.*:CudaModelDummy.*:Tiny/CudaSpeculative.*:CudaSpeculativeEngine.*' > $O/s21-2-model-tests.log 2>&1
echo "model tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED)" $O/s21-2-model-tests.log | head
K3_MOE_TIMING_SHAPES=qat timeout 150 $T --gtest_filter='CudaMoe.Timing' > $O/s21-2-moe-timing.log 2>&1; echo "timing rc=$? $(el)"
grep -iE "decode" $O/s21-2-moe-timing.log | head -40
for r in 1 2; do for v in reg ring; do [ $(left) -gt 150 ] || break
  K3_MOE_DEC_VARIANT=$v timeout 140 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 0 -n 32 -b 1,8,64 -r 2 --mem-bw -1 > $O/s21-2-k3s4-$v-$r.txt 2>&1
  echo "k3 slice $v r$r rc=$? $(el)"; grep -E "^\| " $O/s21-2-k3s4-$v-$r.txt | grep tg | head -4; done; done
wait $CK
for r in 1 2; do for v in 0 1; do [ $(left) -gt 25 ] || break
  K3_HYBRID_OVERLAP=$v timeout 40 $B bench offline -m $G --device cuda --cpu-moe -t 16 -p 0 -n 64 -b 1,8 -r 2 --mem-bw -1 > $O/s21-2-ovl$v-$r.txt 2>&1
  echo "overlap=$v r$r $(el)"; grep -E "^\| " $O/s21-2-ovl$v-$r.txt | grep tg | head -3; done; done
echo "done $(el)"
