# Shared steps of the device calls that compare k3's CPU decode with llama.cpp's on the H200 host (sourced by
# scripts/perf/gpu-sNN-*.sh from session 27 on; the session-26 call scripts kept their own copies as they ran).
# Expects: GW (the carried folder: bins.tar.xz, <model>.tpl.json.xz, llama-cpu-src.tar.xz), D (where the
# binaries go), el (elapsed-time printer).

# Unpacks k3's binaries (k3r, ... and their libraries) into $D.
peer_unpack_bins() { mkdir -p "$D" && tar -xJf "$GW/bins.tar.xz" -C "$D"; }

# Builds llama.cpp's llama-bench (CPU, -DGGML_NATIVE=ON) from the carried source in the background; sets LB (its
# pid) and LBIN (where llama-bench lands). `wait $LB` before using it.
peer_llama_build_bg() {
  ( mkdir -p /tmp/ll && tar -xJf "$GW/llama-cpu-src.tar.xz" -C /tmp/ll && cd /tmp/ll/llama.cpp &&
    cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
    nice cmake --build b -j14 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
  LB=$!
  LBIN=/tmp/ll/llama.cpp/b/bin
}

# Writes the random checkpoints /tmp/<model> from their templates and k3's GGUF of each (/tmp/<model>.gguf).
# PEER_K3: the k3 binary in $D that converts (default k3r).
peer_checkpoints() {
  local m
  for m in "$@"; do
    xz -dc "$GW/$m.tpl.json.xz" > "/tmp/$m.tpl.json" &&
      python3 scripts/random_checkpoint.py write "/tmp/$m.tpl.json" "/tmp/$m" > "/tmp/ckpt-$m.log" 2>&1
    echo "ckpt $m rc=$? $(el)"
    LD_LIBRARY_PATH=$D "$D/${PEER_K3:-k3r}" convert -m "/tmp/$m" -o "/tmp/$m.gguf" > "/tmp/convert-$m.log" 2>&1
    echo "convert $m rc=$? $(el)"
  done
}

# One k3 decode measurement: peer_k3_tg BINARY MODEL LABEL [ENV=VALUE...] (tg128, 2 repetitions, 16 threads).
peer_k3_tg() {
  local b=$1 m=$2 lab=$3
  shift 3
  env LD_LIBRARY_PATH=$D "$@" timeout 40 "$D/$b" bench offline -m "/tmp/$m" -p 0 -n 128 -r 2 -t 16 > /tmp/e2e.txt 2>&1
  echo "k3 $m $lab: $(grep -E "^\| $m" /tmp/e2e.txt | cut -d'|' -f3,6,9 | tr '\n' ' ') $(el)"
}

# llama.cpp's decode on the same weights: peer_llama_tg MODEL ROUND.
peer_llama_tg() {
  timeout 40 "$LBIN/llama-bench" -m "/tmp/$1.gguf" -p 0 -n 128 -t 16 -r 2 -o md > /tmp/ll.txt 2>&1
  echo "llama $1 r$2: $(grep -E 'tg128' /tmp/ll.txt | awk -F'|' '{print $(NF-1)}') $(el)"
}

# From session 45 (scripts/perf/gpu-s45-*.sh): llama-bench built in the background from the carried slim source
# ($GW/llama-cpu-slim.tar.xz, scripts/peer/pack-llama-slim); sets LB (its pid) and LBIN.
peer_llama_slim_bg() {
  ( mkdir -p /tmp/ll && tar -xJf "$GW/llama-cpu-slim.tar.xz" -C /tmp/ll && cd /tmp/ll/llama.cpp &&
    cmake -S . -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cfg.log 2>&1 &&
    nice cmake --build b -j10 --target llama-bench > /tmp/llama-build.log 2>&1; echo "llama build rc=$?" >> /tmp/llama-build.log ) &
  LB=$!
  LBIN=/tmp/ll/llama.cpp/b/bin
}

# kl-1b's template ($GW/kl.tpl.json.xz) written as /tmp/kl and k3's Q4_K_M of it (/dev/shm/kl-q4km.gguf, by $D/k3), in
# the background; sets QB (its pid).
peer_kl_q4km_bg() {
  ( xz -dc "$GW/kl.tpl.json.xz" > /tmp/kl.tpl.json && nice python3 scripts/random_checkpoint.py write /tmp/kl.tpl.json /tmp/kl > /tmp/ckpt.log 2>&1 &&
    nice "$D/k3" quantize /tmp/kl /dev/shm/kl-q4km.gguf Q4_K_M -t 4 > /tmp/q.log 2>&1; echo "kl-q4km rc=$?" >> /tmp/q.log ) &
  QB=$!
}

# From session 46 (scripts/perf/gpu-s46-{1,2}.sh): peer_gguf_rounds_t16 GGUF MIN_LEFT -- two alternating rounds of k3
# (`bench offline --no-mmap -p 0 -n 64 -r 2 -t 16`, the memory rate read around it) and llama-bench ($LBIN, the same
# file, 16 threads) into $OUT/cpu-t16.txt; a round starts only with more than MIN_LEFT seconds left (`left`).
peer_gguf_rounds_t16() {
  local g=$1 min=$2 r
  for r in 1 2; do [ "$(left)" -gt "$min" ] || break
    { echo "round $r $(el)"
      timeout 90 "$D/k3" bench offline -m "$g" --no-mmap -p 0 -n 64 -r 2 -t 16 2>&1 | grep -E "memory read|moved|^\| |GB/step"
      echo "k3 done $(el)"
      timeout 90 "$LBIN/llama-bench" -m "$g" -p 0 -n 64 -t 16 -r 2 -o md 2>&1 | grep -E "^\||error" | tail -3; echo "llama done $(el)"; } 2>&1 | tee -a "$OUT/cpu-t16.txt"
  done
}

# From session 45 (scripts/perf/gpu-s45-{1,2}.sh): llama.cpp's CPU build and kl-1b's Q4_K_M in the background while the
# whole CUDA suite runs (lib-k3-bins.sh's kl_dummy_args and cuda_suite), then both waited for; LBIN, KL and BW set.
peer_kl1b_prep_during_suite() {
  peer_llama_slim_bg
  peer_kl_q4km_bg
  kl_dummy_args
  cuda_suite
  wait "$LB" "$QB"; tail -1 /tmp/llama-build.log; tail -2 /tmp/q.log; echo "cpu prep done $(el)"
}
