#!/bin/bash
# session 21 call 3: the final CUDA code: the whole CUDA suite; the MXFP4 Auto rule (decode kernel from n = 1) vs the
# SIMT path at b1 / b2 on the dummy K3 slice; hybrid --cpu-moe decode on the GGUF and the HF dir after the VBMI
# nibble decode of the CPU tier; CPU-only decode at 16 threads
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 570 - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork; BD=/tmp/bd; mkdir -p $BD
mkdir -p /tmp/k3b && tar -xJf $GW/k3bins.tar.xz -C /tmp/k3b && export LD_LIBRARY_PATH="/tmp/k3b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=/tmp/k3b/k3; T=/tmp/k3b/k3_cuda_tests; M=$BD/k3fr; G=$BD/k3fr.gguf
( xz -dc $GW/llama/k3-1b-fr.tpl.json.xz > /tmp/k3fr.tpl.json && nice python3 scripts/random_checkpoint.py write /tmp/k3fr.tpl.json $M > /tmp/ckpt.log 2>&1 && $B convert -m $M -o $G > /tmp/conv.log 2>&1; echo "ckpt+gguf rc=$?" ) &
CK=$!
$B info > $O/s21-3-info.txt 2>&1
$T --gtest_filter='-*Timing*:TpNccl.*' > $O/s21-3-suite.log 2>&1; echo "suite rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED)|tests from .* ran" $O/s21-3-suite.log | head -12
for r in 1 2; do for v in simt auto; do [ $(left) -gt 150 ] || break
  if [ $v = simt ]; then E="K3_MOE_DECODE=simt"; else E="K3_UNUSED=1"; fi
  env $E timeout 100 $B bench offline --device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 0 -n 32 -b 1,2 -r 3 --mem-bw -1 > $O/s21-3-k3s4-$v-$r.txt 2>&1
  echo "k3 slice $v r$r rc=$? $(el)"; grep -E "^\| kimi" $O/s21-3-k3s4-$v-$r.txt | head -2; done; done
wait $CK
for r in 1 2; do for m in $G $M; do [ $(left) -gt 30 ] || break
  timeout 40 $B bench offline -m $m --device cuda --cpu-moe -t 16 -p 512 -n 128 -b 1 -r 3 --mem-bw -1 > $O/s21-3-hyb-$(basename $m)-$r.txt 2>&1
  echo "hybrid $(basename $m) r$r $(el)"; grep -E "^\| k3fr" $O/s21-3-hyb-$(basename $m)-$r.txt | head -2; done; done
for m in $G $M; do [ $(left) -gt 20 ] || break
  timeout 30 $B bench offline -m $m --device cpu -t 16 -p 0 -n 32 -b 1 -r 3 --mem-bw -1 > $O/s21-3-cpu-$(basename $m).txt 2>&1
  echo "cpu-only $(basename $m) $(el)"; grep -E "^\| k3fr" $O/s21-3-cpu-$(basename $m).txt | head -1; done
echo "done $(el)"
