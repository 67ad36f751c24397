#!/bin/bash
# session 28 call 2 (issue 15): the quality table on k3-small, the model call 1 trained (out/k3small/hf, kept on the
# warm machine), on the H200 host's 16 cores: k3's imatrix from chat-formatted calibration text (--parse-special),
# every k3 preset (with and without it) and llama-quantize's mixes of the same BF16 GGUF with the same imatrix,
# REAP / frequency pruning at two ratios, each scored by `k3 perplexity --kl-divergence` against the HF dir's base
# on held-out text; tok/s CPU (16 threads) and CUDA for the main files; k3-small's perplexity on the CUDA paths
# (exact, bf16 GEMMs with the tensor-core KDA prefill, + the fused KDA kernel) against the CPU's.
# Carry: .gpuwork/s27 (llama-cpu-src.tar.xz). Results: $OUT/s28-2-*.jsonl / .log.
set -u
T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-585} - $(date +%s) + T0 )); }
O=$OUT; P=s28-2; W=/tmp/q; mkdir -p $W
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
K3=${K3:-$PWD/build/cuda/k3}; M=${M:-$PWD/out/k3small/hf}; DATA=${DATA:-/tmp/data}
if [ ! -x $K3 ] || [ ! -f $M/config.json ]; then echo "call 1's build or model is gone (machine not warm)"; ls out build; exit 3; fi
( [ -x /tmp/ll/llama.cpp/b/bin/llama-quantize ] && { echo "llama build rc=0 (already built)" >> /tmp/llama-build.log; exit 0; }; mkdir -p /tmp/ll && tar -xJf .gpuwork/s27/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  nice cmake --build b -j6 --target llama-quantize > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LQ=/tmp/ll/llama.cpp/b/bin/llama-quantize
# evaluation text: held-out (val split) prose + code; calibration: train split (chat rendered with the template + prose + code)
head -c ${EVAL_EN:-32000} $DATA/val_english.txt > $W/eval.txt; head -c ${EVAL_PY:-16000} $DATA/val_python.txt >> $W/eval.txt
TH="-t ${THREADS:-10}"   # 10 of 16 cores: the llama.cpp build runs beside for the first minutes
$K3 perplexity -m $M -f $W/eval.txt --ctx 512 $TH --kl-divergence-base $W/base.kld --json $W/base.json > $O/$P-base.log 2>&1
echo "base rc=$? $(el)"; grep -E "^(tokens|perplexity|tok_per_s)" $O/$P-base.log | tr '\n' ' '; echo
$K3 imatrix -m $M -f $DATA/calib.txt --parse-special -c 512 -o $W/small.imatrix $TH > $O/$P-imatrix.log 2>&1
echo "imatrix rc=$? $(el)"; tail -1 $O/$P-imatrix.log
$K3 convert -m $M -o $W/bf16.gguf > /tmp/convert.log 2>&1; echo "convert rc=$? $(el)"
J=$O/$P-quality.jsonl; : > $J
# score LABEL TOOL FILE QTIME: KLD of FILE against the base, one JSON line
score() {
  local lab=$1 tool=$2 f=$3 qt=$4
  if [ ! -e "$f" ]; then echo "$lab $tool: no file"; return; fi
  $K3 perplexity -m "$f" --kl-divergence-base $W/base.kld --kl-divergence $TH --json $W/r.json > $W/r.log 2>&1 || { echo "$lab: ppl failed"; tail -3 $W/r.log; return; }
  python3 -c "import json,os,sys; j=json.load(open('$W/r.json')); k=j['kl_divergence']
print(json.dumps({'preset':'$lab','tool':'$tool','bytes':int(sys.argv[1]),'quant_s':$qt,**k}))" $(du -sb "$f" | cut -f1) >> $J
  echo "$lab $tool: $(tail -1 $J | cut -c1-220) $(el)"
}
kq() {  # kq LABEL PRESET [args...]
  local lab=$1 pre=$2; shift 2; local t=$(date +%s.%N)
  $K3 quantize "$@" $M $W/$lab.gguf $pre $TH > $W/q-$lab.log 2>&1 || { echo "$lab quantize failed"; tail -3 $W/q-$lab.log; }
  score $lab k3 $W/$lab.gguf $(python3 -c "import time;print(round(time.time()-$t,1))")
}
for p in Q8_0 Q6_K Q5_K_M Q4_K_M Q3_K_M Q2_K IQ4_XS Q4_K_M-KDA8 Q4_K_M-E3 Q4_K_M-E2 Q4_K_M-EIQ3 Q4_K_M-EIQ2 Q4_K_M-EIQ1; do
  [ $(left) -gt 200 ] || break
  kq k3-$p $p --imatrix $W/small.imatrix
done
for p in Q4_K_M Q2_K Q4_K_M-EIQ2; do [ $(left) -gt 200 ] && kq k3-noim-$p $p; done
# llama-quantize's Q4_K_M recipe with IQ2 experts (row ll-Q4_K_M-exps-iq2 below) through k3's quantiser: equal types
[ $(left) -gt 200 ] && kq k3-Q4_K_M-exps-iq2 Q4_K_M --imatrix $W/small.imatrix --tensor-type "ffn_(gate|up)_exps=iq2_xxs" \
  --tensor-type "ffn_down_exps=iq2_xs"
while ! grep -q "llama build rc" /tmp/llama-build.log 2>/dev/null && [ $(left) -gt 150 ]; do sleep 2; done
tail -1 /tmp/llama-build.log; TH="-t ${THREADS:-16}"
lq() {  # lq LABEL TYPE [args...]
  local lab=$1 ty=$2; shift 2; local t=$(date +%s.%N)
  $LQ --allow-requantize --imatrix $W/small.imatrix "$@" $W/bf16.gguf $W/$lab.gguf $ty 16 > $W/lq-$lab.log 2>&1 ||
    { echo "$lab llama-quantize failed"; tail -3 $W/lq-$lab.log; }
  score $lab llama $W/$lab.gguf $(python3 -c "import time;print(round(time.time()-$t,1))")
}
if [ -x $LQ ]; then
  for ty in Q8_0 Q6_K Q5_K_M Q4_K_M Q3_K_M Q2_K IQ4_XS; do [ $(left) -gt 130 ] && lq ll-$ty $ty --tensor-type _exps=mxfp4; done
  [ $(left) -gt 130 ] && lq ll-Q4_K_M-exps-iq2 Q4_K_M --tensor-type "ffn_(gate|up)_exps=iq2_xxs" --tensor-type "ffn_down_exps=iq2_xs"
  # k3's imatrix has no entries for attn_k_b / attn_v_b (kv_b's halves, one matrix in k3's graph): llama-quantize
  # refuses a very low-bit type without one, so those two are Q8_0 here (call s28-3)
  for ty in IQ3_XXS IQ2_M IQ2_XXS IQ1_M IQ1_S; do
    [ $(left) -gt 130 ] && lq ll-$ty $ty --tensor-type attn_k_b=q8_0 --tensor-type attn_v_b=q8_0
  done
fi
# REAP / frequency pruning (HF dir out, experts MXFP4 as shipped)
for spec in reap:0.25 reap:0.5 frequency:0.25 frequency:0.5; do
  [ $(left) -gt 90 ] || break
  m=${spec%%:*}; r=${spec##*:}; d=$W/prune-$m-$r; t=$(date +%s.%N)
  $K3 prune -m $M -o $d -f $DATA/calib.txt --parse-special --method $m --ratio $r $TH > $W/prune-$m-$r.log 2>&1 ||
    { echo "prune $spec failed"; tail -3 $W/prune-$m-$r.log; continue; }
  score prune-$m-$r k3 $d $(python3 -c "import time;print(round(time.time()-$t,1))")
done
# speed: decode tg64 batch 1, CPU 16 threads and CUDA, same files
S=$O/$P-speed.log; : > $S
for f in $M $W/k3-Q8_0.gguf $W/k3-Q4_K_M.gguf $W/ll-Q4_K_M.gguf $W/k3-Q2_K.gguf $W/k3-Q4_K_M-EIQ2.gguf $W/k3-Q4_K_M-EIQ1.gguf; do
  [ $(left) -gt 40 ] || break
  [ -e $f ] || continue
  for dev in cpu cuda; do
    timeout 30 $K3 bench offline -m $f --device $dev -p 0 -n 64 -r 2 $TH > $W/b.txt 2>&1
    echo "$(basename $f) $dev: $(grep -E '^\| .* \| tg64 \| 0 \| 1 \|' $W/b.txt | cut -c1-160)" | tee -a $S
  done
done
# k3-small on the CUDA paths vs the CPU (the tensor-core KDA prefill: D = 128, bounded gate; + the fused kernel)
C=$O/$P-cuda-ppl.log; : > $C
for v in "cpu" "cuda" "cuda --gemm-precision bf16" "cuda --gemm-precision bf16 FUSED"; do
  [ $(left) -gt 15 ] || break
  e=""; a=${v% FUSED}; [ "$a" != "$v" ] && e="K3_KDA_TC_FUSED=5"
  env $e timeout 40 $K3 perplexity -m $M -f $W/eval.txt --ctx 512 --device $a > $W/p.txt 2>&1
  echo "$v: $(grep -E '^(perplexity|tok_per_s)' $W/p.txt | tr '\n' ' ')" | tee -a $C
done
cp $W/small.imatrix $O/$P-k3small.imatrix 2>/dev/null
echo "done $(el)"
