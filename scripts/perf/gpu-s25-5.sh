#!/bin/bash
# session 25 call 5: (issue 14) 16-thread CPU decode after the MXFP4 prefetch, the parallel few-token conv and the
# shared expert-input conversion, against llama.cpp 0c1e570 (CPU build in the call) on the same weights: kl-1b and
# k3-1b-fr, tg128 -t 16, alternating; the MoE decode-layer microbenchmark at 1 / 8 / 16 threads from L3 and DRAM.
# (issue 18, when KDA=1) the KDA state v2 / intra v3 kernels: CudaKdaTc tests, sanitizer, the one-process bench vs fla.
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-560} - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/${GWDIR:-s25}; D=/tmp/b25
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  nice cmake --build b -j8 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LB=$!
if [ "${KDA:-0}" = 1 ]; then
  mkdir -p /tmp/fla && tar -xJf $GW/fla-src.tar.xz -C /tmp/fla
  ( nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
      scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu $(ls src/k3/backend/cuda/kda_tc_*.cu 2>/dev/null) \
      -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1; echo "shim rc=$?" >> /tmp/kdabuild.log ) &
  SB=$!
fi
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1
  echo "ckpt $m rc=$? $(el)"; $D/k3r convert -m /tmp/$m -o /tmp/$m.gguf > /tmp/convert-$m.log 2>&1; echo "convert $m rc=$? $(el)"
done
[ -x $D/k3_tests ] && for t in 16 8 1; do for E in 64 512; do
  K3_MOE_BENCH_EXPERTS=$E K3_CPU_ISA=avx512bf16 K3_NUM_THREADS=$t timeout 60 $D/k3_tests --gtest_also_run_disabled_tests \
    --gtest_filter='KernelBench.DISABLED_MoeDecodeLayer' 2>&1 | grep -E "moe decode|bandwidth" | sed "s/^/t$t E$E /"
done; done 2>&1 | tee $O/s25-5-moe-layer.txt
echo "moe bench $(el)"
k() {  # model label env...
  local m=$1 lab=$2; shift 2
  env "$@" timeout 40 $D/k3r bench offline -m /tmp/$m -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6,9 | tr '\n' ' ' | sed "s/^/k3 $m $lab: /"; echo " $(el)"
}
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do for m in kl k3fr; do
  k $m amx K3_CPU_ISA=amx
  k $m avx512bf16 K3_CPU_ISA=avx512bf16
  timeout 40 $LBIN/llama-bench -m /tmp/$m.gguf -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m r$r: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}') $(el)"
done; done 2>&1 | tee $O/s25-5-tg16.txt
K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=130 K3_CPU_ISA=amx timeout 40 $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > $O/s25-5-prof-kl-amx-t16.txt 2>&1
grep -A14 "k3 cpu profile" $O/s25-5-prof-kl-amx-t16.txt
echo "cpu done $(el)"
[ "${KDA:-0}" = 1 ] && [ -x scripts/perf/gpu-s25-5-kda.sh ] && BUDGET=$(left) bash scripts/perf/gpu-s25-5-kda.sh
echo "done $(el)"
