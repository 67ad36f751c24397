#!/bin/bash
# session 24 (issue 14): the amx tier with B packed once per matmul, on the GPU host's Xeon (16 cores, AMX), and
# llama.cpp's CPU backend beside it on the same weights. Carried in .gpuwork/amx: bins.tar.xz (release k3 as k3r,
# k3_tests as k3t, their non-system libraries), kl.tpl.json.xz (scripts/random_checkpoint.py template of kl-1b),
# llama-cpu-src.tar.xz (llama.cpp 0c1e570 = llama-cpp-python 0.3.36's vendor tree, CPU sources only).
# 1) CPU kernel tests of every tier (incl. /amx) while the checkpoint is written and llama.cpp builds;
# 2) KernelBench.DISABLED_Matmul avx512bf16 vs amx at 1 and 16 threads; 3) kl-1b end to end, k3 -t 16 per tier
# alternating with llama-bench -t 16 on k3's GGUF of the same weights (pp512, tg128).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( 580 - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/amx; D=/tmp/amxb
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D && export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)|L3'; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
$D/k3r info -m tests/data/tiny-k3 2>&1 | grep -iE 'cpu kernels' | head -3
( xz -dc $GW/kl.tpl.json.xz > /tmp/kl.tpl.json && python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt.log 2>&1; echo "ckpt rc=$?" >> /tmp/ckpt.log ) &
CK=$!
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > $O/s24-llama-cfg.log 2>&1 &&
  cmake --build b -j10 --target llama-bench > $O/s24-llama-build.log 2>&1; echo "llama build rc=$?" >> $O/s24-llama-build.log ) &
LB=$!
K3_SHARED_DIR=$ROOT/../shared $D/k3t --gtest_filter='*Tier*:*CpuKernels*:*CpuIsa*:*CpuFeatures*:*GgufTiny*:*ReduceTree*' > $O/s24-1-tests.log 2>&1
echo "cpu kernel tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED)|FAILED  \]" $O/s24-1-tests.log | head -20
echo "amx tests ok: $(grep -cE 'OK \] .*(amx|Amx)' $O/s24-1-tests.log)"
wait $CK; tail -2 /tmp/ckpt.log; echo "ckpt $(el)"
$D/k3r convert -m /tmp/kl -o /tmp/kl.gguf > /tmp/convert.log 2>&1; echo "convert rc=$? $(el)"
wait $LB; tail -1 $O/s24-llama-build.log; echo "llama $(el)"
for t in 1 16; do for isa in avx512bf16 amx; do
  K3_CPU_ISA=$isa K3_NUM_THREADS=$t timeout 90 $D/k3t --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_Matmul' > /tmp/kb.log 2>&1
  echo "kernelbench $isa t=$t rc=$? $(el)"; grep -E 'matmul bf16' /tmp/kb.log | sed "s/^/$isa t$t /" | tee -a $O/s24-1-kernelbench.txt | cut -c1-150
done; done
LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do
  for isa in avx512bf16 amx; do
    [ $(left) -gt 60 ] || break
    K3_CPU_ISA=$isa timeout 100 $D/k3r bench offline -m /tmp/kl -p 512 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
    echo "k3 $isa r$r rc=$? $(el) load $(cut -d' ' -f1 /proc/loadavg)"; grep -E "^\| kl" /tmp/e2e.txt | sed "s/^/k3 $isa r$r /" | tee -a $O/s24-1-e2e.txt
  done
  [ $(left) -gt 50 ] || break
  timeout 100 $LBIN/llama-bench -m /tmp/kl.gguf -p 512 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama r$r rc=$? $(el)"; grep -E "pp512|tg128" /tmp/ll.txt | sed "s/^/llama r$r /" | tee -a $O/s24-1-e2e.txt
done
for isa in avx512bf16 amx; do
  K3_CPU_ISA=$isa timeout 30 $D/k3r run -m /tmp/kl -p "It is a truth universally" -n 16 -t 16 2>/dev/null | tail -1 | cut -c1-200 | sed "s/^/$isa: /" | tee -a $O/s24-1-e2e.txt
done
echo "done $(el)"
