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
