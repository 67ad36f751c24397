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
