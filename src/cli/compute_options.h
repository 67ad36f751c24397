// The compute-thread flags of the verbs that run a model (llama.cpp's names): -t/--threads N and
// --numa distribute|isolate|numactl. Applied once, before the first kernel runs (load_model does it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace k3cli {

struct ComputeOptions {
  std::optional<int64_t> threads;  // not given: K3_NUM_THREADS / OMP_NUM_THREADS / the CPUs available
  std::string numa;  // "": off
  std::string threads_source;  // why `threads` was chosen when the user did not give it (logs); "": -t
};

void add_compute_options(CLI::App* cmd, ComputeOptions& o);

// Validates (-t 1..1024, a known --numa mode), sizes and places the global ThreadPool, and pins the
// calling thread to thread 0's CPUs (threads it starts later, the engine's included, inherit them).
// With --numa, prints the placement to stderr. Throws k3::Error.
void apply_compute_options(const ComputeOptions& o);

// "2 (-t)" / "2 (K3_NUM_THREADS)" ... plus the placement: for `k3 info`. Valid after apply_compute_options.
std::string compute_threads_summary();

}  // namespace k3cli
