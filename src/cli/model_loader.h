// `--device` / `--load-format` / the cache dtypes for the verbs that run a model, and the one place that picks the
// backend: the CPU `k3::Model`, or the CUDA backend when k3 is built with it (K3_CUDA=ON).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/compute_options.h"
#include "k3/model/config.h"
#include "k3/runtime/model_runner.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

struct DeviceOptions {
  std::string device = "cpu";         // cpu | cuda | cuda:N
  std::string load_format = "auto";   // auto (safetensors) | dummy (random weights, config.json only; CUDA)
  std::string preset;                 // dummy: a built-in config (resources/presets) instead of -m's config.json
  int64_t num_layers = 0;             // dummy: keep only the first N layers (0: all)
  std::string gemm = "bf16x2";        // cuda: prefill GEMM precision (bf16x2 | bf16)
  bool enforce_eager = false;         // cuda: no CUDA graphs
  std::string kv_cache_dtype = "auto";         // MLA latent rows: auto|float32|bf16|fp8 (vLLM's flag)
  std::string mamba_ssm_cache_dtype = "auto";  // KDA state: auto|float32|bfloat16 (vLLM's flag)
  std::string moe_activation_dtype = "float32";  // routed experts' activations: float32|mxfp8 (cpu; core/mxfp8.h)
  std::vector<std::string> override_tensor;    // -ot PATTERN=DEVICE (llama.cpp's flag)
  bool cpu_moe = false;                        // --cpu-moe: routed experts on the CPU
  int n_cpu_moe = 0;                           // --n-cpu-moe N: the routed experts of the first N layers
  ComputeOptions compute;                      // -t/--threads, --numa (applied by load_model, before any kernel)
  bool apply_compute = true;                   // load_model applies `compute` (false: an earlier load of this process did)
  // Routed-expert residency (CPU; runtime/expert_residency.h, docs/bigger-than-ram.md).
  double expert_cache_gb = -1;                 // --expert-cache-gb: pinned hot-set budget (-1 auto, 0 none)
  std::string expert_prefetch = "threads";     // --expert-prefetch none|madvise|threads
  bool no_expert_residency = false;            // --no-expert-residency: no counting, prefetch or pinning
  bool no_mmap = false;                        // --no-mmap: model files read into memory (k3::FileLoad::Read)
  bool no_repack = false;                      // --no-repack: no CPU copies of the MXFP4 experts (Model::add_decode_layouts)
  std::string tokenizer;                       // --tokenizer DIR: tiktoken.model + tokenizer_config.json (a GGUF's)
  int tensor_parallel_size = 1;                // --tensor-parallel-size / --tp N: ranks of `mpirun -np N` (vLLM's flag)
  bool enable_expert_parallel = false;         // --enable-expert-parallel: routed experts whole, a block per rank
  bool ep_all_to_all = false;                  // --ep-all-to-all: EP dispatch / combine through all-to-all
  std::string expert_placement;                // --expert-placement: a permutation of the experts (comma list)
  // Several hosts (torchrun's / vLLM's names; k3::dist::RendezvousOptions): node 0 listens on
  // master_addr:master_port, the others join; one rank per node so far.
  int nnodes = 1, node_rank = 0, master_port = 29500;
  std::string master_addr = "127.0.0.1";
};

void add_device_options(CLI::App* cmd, DeviceOptions& d);

// --load-format dummy's config: d.preset's, else DIR's config.json; cut to d.num_layers (k3 bench / run / serve,
// and k3 convert / quantize writing a GGUF of random weights at a real model's shapes).
k3::ModelConfig dummy_config(const std::string& dir, const DeviceOptions& d);

// The tokenizer of the model at `model_path`: --tokenizer DIR if given, else the HF directory itself, else
// (a GGUF file) the directory holding it when that has a tiktoken.model, else the GGUF's own tokenizer.ggml.*
// arrays when they are a Kimi vocabulary (cli/gguf_vocab.h; docs/gguf.md).
k3::text::Tokenizer load_tokenizer(const std::string& model_path, const DeviceOptions& d);

// Applies d.compute first (unless d.apply_compute is false). Throws k3::Error for an unknown device, a device this build lacks, or a failed load.
// Under mpirun with --tensor-parallel-size N, every rank loads its shard (k3::dist::TpModel); ranks other
// than 0 run rank 0's steps and exit the process (status 0) when rank 0 is done: only rank 0 returns.
std::unique_ptr<k3::ModelRunner> load_model(const std::string& dir, const DeviceOptions& d);

// `k3 serve --data-parallel-size`: the options replica `i` loads with. --device cuda[:N]: GPU (N + i) mod the
// visible GPUs (several replicas may share one); the CPU: the CPU. Replicas after the first leave the
// compute options alone: they size the one global thread pool, which is set once (it throws after).
DeviceOptions replica_device_options(const DeviceOptions& d, int i);

}  // namespace k3cli
