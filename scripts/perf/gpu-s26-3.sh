#!/bin/bash
# session 26 call 3. CPU (issue 14), on the idle host first: 16-thread decode of the build with the shared experts'
# down beside the routed experts (k3r) against the build before it (k3mid: router + shared gate / up grouped only),
# the MXFP4 one-token prefetch level / distance (K3_MXFP4_PREFETCH, K3_MXFP4_PREFETCH_ROWS) and the expert batch's
# blocks per thread (K3_BATCH_BLOCKS_PER_THREAD) as variants, llama.cpp 0c1e570 (CPU build in the call) on k3's
# GGUF of the same weights; a per-op profile. GPU (issue 18 item 1): the KDA intra and state kernels run
# concurrently (K3_KDA_TC_OVERLAP): bitwise checks (scripts/check_kda_tc.py), CudaKdaTc gtests + memcheck, the
# one-process bench against fla chunk_kda (bc3b101d).
set -u
ROOT=$PWD; T0=$(date +%s); el() { echo "+$(( $(date +%s) - T0 )) s"; }; left() { echo $(( ${BUDGET:-570} - $(date +%s) + T0 )); }
O=$OUT; GW=$ROOT/.gpuwork/s26; D=/tmp/b26
mkdir -p $D && tar -xJf $GW/bins.tar.xz -C $D
lscpu | grep -E 'Model name|^CPU\(s\)'
( mkdir -p /tmp/ll && tar -xJf $GW/llama-cpu-src.tar.xz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
  cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
  nice cmake --build b -j12 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
LB=$!
for m in kl k3fr; do
  xz -dc $GW/$m.tpl.json.xz > /tmp/$m.tpl.json && python3 scripts/random_checkpoint.py write /tmp/$m.tpl.json /tmp/$m > /tmp/ckpt-$m.log 2>&1
  echo "ckpt $m rc=$? $(el)"; LD_LIBRARY_PATH=$D $D/k3r convert -m /tmp/$m -o /tmp/$m.gguf > /tmp/convert-$m.log 2>&1; echo "convert $m rc=$? $(el)"
done
wait $LB; tail -1 /tmp/llama-build.log; echo "llama $(el)"
k() {  # binary model label env...
  local b=$1 m=$2 lab=$3; shift 3
  env LD_LIBRARY_PATH=$D "$@" timeout 40 $D/$b bench offline -m /tmp/$m -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  echo "k3 $m $lab: $(grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6,9 | tr '\n' ' ') $(el)"
}
LBIN=/tmp/ll/llama.cpp/b/bin
for r in 1 2; do for m in kl k3fr; do
  k k3r $m "new (beside)" K3_CPU_ISA=amx
  k k3mid $m "mid (grouped only)" K3_CPU_ISA=amx
  k k3r $m "new, prefetch t1 16 rows" K3_CPU_ISA=amx K3_MXFP4_PREFETCH=t1 K3_MXFP4_PREFETCH_ROWS=16
  k k3r $m "new, 4 blocks per thread" K3_CPU_ISA=amx K3_BATCH_BLOCKS_PER_THREAD=4
  timeout 40 $LBIN/llama-bench -m /tmp/$m.gguf -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $m r$r: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}') $(el)"
done; done 2>&1 | tee $O/s26-3-tg16.txt
LD_LIBRARY_PATH=$D K3_CPU_PROFILE=1 K3_CPU_PROFILE_SKIP=130 K3_CPU_ISA=amx timeout 40 $D/k3r bench offline -m /tmp/kl -p 0 -n 128 -r 2 -t 16 > $O/s26-3-prof-kl.txt 2>&1
grep -A16 "k3 cpu profile" $O/s26-3-prof-kl.txt
echo "cpu done $(el)"
# ---- GPU: KDA overlap ----
( OUT=/tmp K3_GPU_CMAKE_ARGS="-DK3_GRAMMAR=OFF -DK3_MPI=OFF" K3_GPU_TARGETS=k3_cuda_tests . scripts/gpu-build; echo "build done $(el)" > /tmp/build.done ) &
mkdir -p /tmp/fla && tar -xJf $GW/fla-src.tar.xz -C /tmp/fla
nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -shared -Xcompiler -fPIC -Isrc \
  scripts/kda_bench_shim.cu src/k3/backend/cuda/kda_kernels.cu src/k3/backend/cuda/kda_chunked_tc.cu src/k3/backend/cuda/kda_tc_state2.cu \
  -o /tmp/libkdashim.so > /tmp/kdabuild.log 2>&1; echo "shim rc=$? $(el)"; tail -3 /tmp/kdabuild.log
PYTHONUNBUFFERED=1 timeout 120 python3 scripts/check_kda_tc.py /tmp/libkdashim.so > $O/s26-3-kda-check.log 2>&1; echo "check rc=$? $(el)"
grep -E 'overlap|FAIL|ALL OK|FAILURES' $O/s26-3-kda-check.log | cut -c1-200 | head -40
while [ ! -f /tmp/build.done ] && [ $(left) -gt 200 ]; do sleep 2; done; cat /tmp/build.done 2>/dev/null; tail -2 /tmp/build.log
export LD_LIBRARY_PATH=/opt/k3deps/usr/lib/x86_64-linux-gnu
T=build/cuda/k3_cuda_tests
if [ -x $T ]; then
  timeout 100 $T --gtest_filter='CudaKdaTc.*' > $O/s26-3-cuda-tests.log 2>&1; echo "CudaKdaTc rc=$? $(el)"; grep -E '^\[  (FAILED|PASSED) ' $O/s26-3-cuda-tests.log | head
  timeout 100 compute-sanitizer --tool memcheck $T --gtest_filter='CudaKdaTc.Overlap*' >> $O/s26-3-cuda-tests.log 2>&1; echo "memcheck rc=$? $(el)"
  grep -E 'ERROR SUMMARY' $O/s26-3-cuda-tests.log | tail -2
fi
KDA_BENCH_SHAPES=1x8192x96,8x1024x96,1x8192x32 KDA_BENCH_ONLY="bf16-in intra5,safe_gate" \
  PYTHONPATH=/tmp/fla PYTHONUNBUFFERED=1 timeout $(( $(left) - 40 )) python3 scripts/bench_kda_tc.py /tmp/libkdashim.so > $O/s26-3-kda-bench.log 2>&1
echo "bench rc=$? $(el)"; grep -E "GPU| ms " $O/s26-3-kda-bench.log | cut -c1-150
for p in 2 1; do  # the overlapped launch's intra blocks per SM forced (the rule's pick is in the rows above)
  echo "== K3_KDA_TC_OVERLAP_INTRA_PER_SM=$p" >> $O/s26-3-kda-bench.log
  K3_KDA_TC_OVERLAP_INTRA_PER_SM=$p KDA_BENCH_SHAPES=1x8192x96,8x1024x96 KDA_BENCH_ONLY="overlap" PYTHONUNBUFFERED=1 \
    timeout $(( $(left) - 3 )) python3 scripts/bench_kda_tc.py /tmp/libkdashim.so >> $O/s26-3-kda-bench.log 2>&1
done
echo "per-SM rc=$? $(el)"; grep -A8 "OVERLAP_INTRA_PER_SM" $O/s26-3-kda-bench.log | grep -E "==| ms " | cut -c1-150
echo "done $(el)"
