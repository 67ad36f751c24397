# Sourced by device-call scripts from session 45 on (GW: the carried .gpuwork folder, D: where the binaries go, el:
# the elapsed-time printer).
# k3bins_unpack: scripts/gpu-pack-bins' pack into $D, its library path, no shared dir, the card's name.
k3bins_unpack() {
  mkdir -p "$D" && tar -xJf "$GW/k3bins.tar.xz" -C "$D"
  export LD_LIBRARY_PATH=$D:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} K3_SHARED_DIR=/nonexistent
  nvidia-smi --query-gpu=name --format=csv,noheader
  ulimit -c 0
}
# kl_dummy_args: KL = the Kimi-Linear-48B dummy's bench arguments (its first 12 layers on an 80 GB card) and BW = the
# roofline bandwidth (GB/s) of the card.
kl_dummy_args() {
  local mem
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  BW=4175; KL="--device cuda --load-format dummy --preset kimi-linear-48b-a3b"
  if [ "$mem" -lt 100000 ]; then BW=3350; KL="$KL --num-layers 12"; fi
}
# cuda_suite: the whole k3_cuda_tests (200 s at most) into $OUT/suite.log.xz; prints its verdict.
cuda_suite() {
  timeout 200 "$D/k3_cuda_tests" > "$OUT/suite.log" 2>&1
  echo "suite rc=$? $(el)"
  grep -E "^\[  (FAILED|PASSED) " "$OUT/suite.log" | head
  xz -9 "$OUT/suite.log"
}
# kl48_gguf_bg THREADS: in the background, a GGUF at Kimi-Linear-48B's true dimensions (k3's Q4_K_M, MXFP4 routed
# experts; scripts/peer/kl48_dummy_dir.py) written by `k3 quantize --load-format dummy` as G=/dev/shm/kl48-q4km.gguf
# (26.5 GB, ~70-95 s); sets QB (its pid; /tmp/q48.log ends with its status). Needs $GW/tiktoken.model.xz.
kl48_gguf_bg() {
  G=/dev/shm/kl48-q4km.gguf
  ( xz -dc "$GW/tiktoken.model.xz" > /tmp/tiktoken.model && python3 scripts/peer/kl48_dummy_dir.py /tmp/kl48 /tmp/tiktoken.model &&
    nice "$D/k3" quantize --load-format dummy /tmp/kl48 "$G" Q4_K_M -t "$1" > /tmp/q48.log 2>&1; echo "kl48 rc=$? $(el)" >> /tmp/q48.log ) &
  QB=$!
}
# bench_arm LABEL BINARY ENV ARGS...: one `$D/BINARY bench offline ARGS` (ARM_TIMEOUT, default 40 s, at most) under ENV (VAR=VALUE words, or
# ""), printed as "LABEL rc=N <the model's table row>" -- the arms of the alternating A/B loops from session 46 on.
bench_arm() {
  local label=$1 bin=$2 envs=$3
  shift 3
  env $envs timeout "${ARM_TIMEOUT:-40}" "$D/$bin" bench offline "$@" > /tmp/arm.txt 2>&1
  echo "$label rc=$? $(grep -E '^\| (kimi|kl48)' /tmp/arm.txt | head -1)"
}
# ab_rounds ROUNDS MIN_LEFT WHAT "LABEL BINARY [ENV...]" "LABEL BINARY [ENV...]" ARGS...: ROUNDS alternating rounds of
# the two arms' `bench offline ARGS` (labelled "LABEL WHAT rN"), each round only with more than MIN_LEFT seconds left.
ab_rounds() {
  local rounds=$1 min=$2 what=$3 r
  local -a a=($4) b=($5)
  shift 5
  for r in $(seq "$rounds"); do
    [ "$(left)" -gt "$min" ] || break
    bench_arm "${a[0]} $what r$r" "${a[1]}" "${a[*]:2}" "$@"
    bench_arm "${b[0]} $what r$r" "${b[1]}" "${b[*]:2}" "$@"
  done
}
# env_ab ROUNDS MIN_LEFT WHAT A ENV_A B ENV_B ARGS...: k3 under two environments ("" for none).
env_ab() { ab_rounds "$1" "$2" "$3" "$4 k3 $5" "$6 k3 $7" "${@:8}"; }
# bin_ab ROUNDS MIN_LEFT WHAT ARGS...: k3 against k3old (scripts/gpu-pack-ab).
bin_ab() { ab_rounds "$1" "$2" "$3" "k3 k3" "k3old k3old" "${@:4}"; }
# kl48_vs_llama_cuda: issue 15's GPU peer figure (s46-3's form, session 52's calls) -- llama.cpp 0c1e570's CUDA binaries
# from $GW/llama-cuda-bins.tar.xz, the kl48 GGUF (kl48_gguf_bg 16), then two alternating rounds (each with more than 60 s
# left) of k3 `bench offline` and `llama-batched-bench -fa 1` on it at batch 1-16, depth 512, into $OUT/gpu-kl48.txt.
kl48_vs_llama_cuda() {
  local LC=/tmp/llc r
  mkdir -p $LC && tar -xJf "$GW/llama-cuda-bins.tar.xz" -C $LC; echo "llama cuda rc=$? $(el)"
  kl48_gguf_bg 16
  wait $QB; tail -1 /tmp/q48.log
  local K3G="bench offline -m $G --device cuda --kv-cache-dtype bf16 -p 0 -n 32 -d 512 -b 1,2,4,8,16 -r 2"
  for r in 1 2; do [ "$(left)" -gt 60 ] || break
    timeout 80 "$D/k3" $K3G > /tmp/k.txt 2>&1; echo "k3 r$r rc=$? $(el)"; grep -E "^\| kl48" /tmp/k.txt
    timeout 100 $LC/llama-batched-bench -m $G -ngl 99 -fa 1 -c 16384 -b 2048 -ub 512 -npp 512 -ntg 32 -npl 1,2,4,8,16 > /tmp/l.txt 2>&1
    echo "llama r$r rc=$? $(el)"; grep -E "^\||error|failed" /tmp/l.txt | tail -8
  done 2>&1 | tee "$OUT/gpu-kl48.txt"
}
# mla_decode_checks ENV...: `CudaMlaDecode.*` into $OUT/mla-tests.log, memcheck and synccheck of the large-batch wgmma
# test under ENV (VAR=VALUE words: the form under test), the BF16 kernel timing into $OUT/mla-timing.log (session 52).
mla_decode_checks() {
  local tool CS=/usr/local/cuda/bin/compute-sanitizer
  timeout 120 "$D/k3_cuda_tests" --gtest_filter='CudaMlaDecode.*' > "$OUT/mla-tests.log" 2>&1
  echo "mla tests rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|fine vs|fine 1 nh= 96" "$OUT/mla-tests.log" | head -20
  for tool in memcheck synccheck; do
    env "$@" timeout 100 $CS --tool $tool "$D/k3_cuda_tests" --gtest_filter='CudaMlaDecode.WgmmaLargeBatchShortContexts' > /tmp/cs.log 2>&1
    echo "$tool rc=$? $(el) $(grep -E 'ERROR SUMMARY|PASSED|FAILED' /tmp/cs.log | tr '\n' ' ')"
  done | tee "$OUT/sanitizers.txt"
  K3_MLA_TIMING_DTYPE=bfloat16 timeout 200 "$D/k3_cuda_tests" --gtest_filter='CudaMlaDecodeTiming.*' > "$OUT/mla-timing.log" 2>&1
  echo "timing rc=$? $(el)"; grep "timing" "$OUT/mla-timing.log" | sed -e 's/simt .*| wgmma  /| wgmma  /' | head -30
}
# env_rows_ab VAR "VALUE VALUE" MIN_LEFT TIMEOUT ARGS...: two alternating rounds of `k3 bench offline ARGS` with VAR set
# to each value in turn (each run only with more than MIN_LEFT seconds left, at most TIMEOUT s), every table row printed
# ("VALUE rN rc=..." then the rows) into $OUT/k3-slice-ab.txt -- bench_arm's loop for several batch sizes (session 52).
env_rows_ab() {
  local var=$1 values=$2 min=$3 tmo=$4 r v
  shift 4
  for r in 1 2; do
    for v in $values; do
      [ "$(left)" -gt "$min" ] || break 2
      env "$var=$v" timeout "$tmo" "$D/k3" bench offline "$@" > /tmp/k3.txt 2>&1
      echo "$v r$r rc=$? $(el)"; grep -E '^\| kimi|rror' /tmp/k3.txt | head -4
    done
  done | tee "$OUT/k3-slice-ab.txt"
}
# decode_targets: issue 18's end-to-end decode targets (session 52's call 1, run again in session 53): the K3-dims dummy
# (4 layers with its first MLA layer on a card of 100+ GB, else 3) at batch 1 / 8 / 64 / 256, depth 512, and batch 1 / 64
# at depth 8192 with the BF16 cache, into $OUT/k3-slice.txt; the Kimi-Linear-48B dummy (kl_dummy_args) at batch 1 / 64 /
# 256 into $OUT/kl.txt; each with the bench's roofline column at $BW.
decode_targets() {
  kl_dummy_args
  local NL=4 K3A ct
  [ "$BW" = 3350 ] && NL=3
  K3A="--device cuda --load-format dummy --preset kimi-k3 --num-layers $NL --mem-bw $BW"
  {
    timeout 90 $D/k3 bench offline $K3A -p 0 -n 32 -d 512 -b 1,8,64,256 -r 2 > /tmp/k3.txt 2>&1
    echo "k3 ${NL}L d512 rc=$? $(el)"; grep -E '^\| kimi' /tmp/k3.txt
    for ct in "--kv-cache-dtype bf16"; do
      [ $(left) -gt 300 ] || break
      timeout 120 $D/k3 bench offline $K3A $ct -p 0 -n 32 -d 8192 -b 1,64 -r 2 > /tmp/k3.txt 2>&1
      echo "k3 ${NL}L d8192 ${ct:-fp32 cache} rc=$? $(el)"; grep -E '^\| kimi|rror|out of memory' /tmp/k3.txt | head -4
    done
  } | tee $OUT/k3-slice.txt
  timeout 90 $D/k3 bench offline $KL --mem-bw $BW -p 0 -n 32 -d 512 -b 1,64,256 -r 2 > /tmp/kl.txt 2>&1
  echo "kl rc=$? $(el)"; grep -E '^\| kimi' /tmp/kl.txt | tee $OUT/kl.txt
}
# moe_tests_and_timing SECONDS FILTER: `k3_cuda_tests --gtest_filter=FILTER` (SECONDS at most) into $OUT/tests.log.xz with
# its verdict and the MXFP8 / W4A8 lines, then CudaMoe.Timing on the K3 QAT bank at n = 1 / 8 / 64 (session 56's calls:
# the w4a8 row beside the decode kernels) into $OUT/moe-timing.log.
moe_tests_and_timing() {
  timeout "$1" "$D/k3_cuda_tests" --gtest_filter="$2" > "$OUT/tests.log" 2>&1
  echo "tests rc=$? $(el)"
  grep -E "^\[  (FAILED|PASSED) |^\[ (w4a8|mxfp8|mxfp8 tiles) \]|mxfp8 (prefill|decode)|Failure" "$OUT/tests.log" | head -60
  xz -9 "$OUT/tests.log"
  [ "$(left)" -gt 35 ] || return 0
  K3_MOE_TIMING_SHAPES=qat K3_MOE_TIMING_N=1,8,64 timeout 60 "$D/k3_cuda_tests" --gtest_filter='CudaMoe.Timing' > "$OUT/moe-timing.log" 2>&1
  echo "moe timing rc=$? $(el)"; grep -vE "^\s*$|^\[ RUN|^\[----|^\[====|^Note|^Running" "$OUT/moe-timing.log" | head -30
}
