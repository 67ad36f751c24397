#!/bin/bash
# Session 58 call 2: where the KDA prefill's time goes inside the engine (the profile's new kda/* parts: s58-1 timed
# the layer's launches at 0.78-0.82 ms in isolation where the profile charged 1.67 ms a layer), the bf16 planes and
# the fp32 ones and the bf16x2 default; the K3-dims slice pp4096 bf16 old / new (96 heads: the fused KDA kernel); on
# the host CPU, issue 15's 16-thread kl48 Q4_K_M decode against the read rate (three rounds).
# Carry: .gpuwork/k3bins.tar.xz .gpuwork/tiktoken.model.xz
BUDGET=${BUDGET:-585}
. scripts/perf/lib-call.sh
kl48_gguf_bg 16
KLS="--device cuda --load-format dummy --preset kimi-linear-48b-a3b --num-layers 4 -p 4096 -n 0 -b 1 -r 3"
prof() {  # LABEL ENV ARGS...
  local label=$1 envs=$2; shift 2
  env K3_CUDA_PROFILE=1 K3_CUDA_PROFILE_SKIP=1 $envs timeout 60 "$D/k3" bench offline "$@" > /tmp/p.txt 2>&1
  echo "profile $label rc=$? $(el)"; grep -E "^  [a-z]|^\| kimi" /tmp/p.txt
}
{ prof "kl bf16 planes" "" $KLS --gemm-precision bf16
  prof "kl bf16, fp32 planes" "K3_KDA_PREFILL_IN=f32" $KLS --gemm-precision bf16
  prof "kl bf16x2" "" $KLS; } | tee "$OUT/kl-prof.txt"
K3S="--device cuda --load-format dummy --preset kimi-k3 --num-layers 4 -p 4096 -n 0 -b 1 -r 2 --gemm-precision bf16"
for r in 1 2; do
  ARM_TIMEOUT=90 bench_arm "k3-4L old r$r" k3 "K3_MLA_PREFILL=x2 K3_KDA_PREFILL_IN=f32" $K3S
  ARM_TIMEOUT=90 bench_arm "k3-4L new r$r" k3 "" $K3S
done 2>&1 | tee "$OUT/k3-ab.txt"
wait $QB; tail -1 /tmp/q48.log; echo "gguf done $(el)"; lscpu | grep -E "Model name"
for r in 1 2 3; do [ "$(left)" -gt 60 ] || break
  timeout 60 $D/k3 bench offline -m $G --no-mmap -p 0 -n 64 -r 2 -t 16 > /tmp/k.txt 2>&1
  echo "k3 t16 r$r rc=$? $(el) $(grep -E '^\| kl48' /tmp/k.txt) $(grep -oE 'bandwidth [0-9.]+ GB/s' /tmp/k.txt | tr '\n' ' ')"
done 2>&1 | tee "$OUT/cpu-t16.txt"
echo "done $(el)"
