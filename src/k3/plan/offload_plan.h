// Planning for the deployments most users can afford: one GPU plus a large-RAM host, or the host
// alone, with a checkpoint that may be bigger than RAM. Says what goes where (VRAM, RAM, disk), the
// k3 flags that realise it, and roofline predictions of decode and prefill speed from the memory,
// PCIe and disk bandwidths. Formulas: docs/planning.md section 8.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3/plan/plan.h"

namespace k3::plan {

// One host (CPU server) from resources/hardware.json's "hosts". Units as Hardware: GB = 1e9 B, GB/s.
struct HostSpec {
  std::string key, name, source;
  double ram_gb = 0;      // installed RAM
  double dram_gb_s = 0;   // peak DRAM read bandwidth, all sockets
  double cpu_tflops = 0;  // peak dense matmul rate of the cores for the expert kernels (BF16 / int8 dot products)
  double pcie_gb_s = 0;   // host <-> one GPU, per direction
  double disk_gb_s = 0;   // sequential read of the drive(s) holding the checkpoint
};

// Parses the "hosts" object of a hardware file (absent: empty); throws k3::Error naming entry and field.
std::vector<HostSpec> parse_hosts(const std::string& json_text, const std::string& source);
const std::vector<HostSpec>& builtin_hosts();
HostSpec find_host(const std::vector<HostSpec>& table, const std::string& key);

struct OffloadInput {
  ModelConfig config;
  std::optional<Hardware> gpu;    // none: CPU only
  HostSpec host;
  int64_t context = 8192;         // tokens per sequence
  int64_t batch = 1;              // concurrent decoding sequences
  int64_t prefill_chunk = 2048;   // tokens per prefill step
  CacheDType kv_dtype = CacheDType::BF16;
  CacheDType state_dtype = CacheDType::F32;
  double mem_util = 0.90;         // fraction of VRAM k3 may use
  double ram_util = 0.85;         // fraction of RAM for weights + caches (the rest: OS, page cache headroom)
  std::optional<double> expert_hit_rate;  // measured RAM hit rate of experts (k3 bench); default: uniform routing
  double pcie_sync_us = 10;       // fixed cost of one GPU <-> CPU hand-over (copy launch + synchronisation)
};

// Bytes placed in each tier; "layers" count MoE layers whose routed experts live there.
struct TierBytes {
  double non_expert = 0, experts = 0, cache = 0, workspace = 0;
  double total() const { return non_expert + experts + cache + workspace; }
};

struct PhaseTimes {  // one decode step or one prefill chunk, seconds, each a roofline lower bound
  double gpu = 0, cpu = 0, disk = 0, pcie = 0;
  double serial() const { return gpu + cpu + disk + pcie; }
  double overlapped() const;  // max(gpu, cpu + disk) + pcie: perfect overlap of the two processors
};

struct OffloadPlan {
  OffloadInput in;
  WeightBreakdown weights;
  double expert_bytes_per_expert_layer = 0;  // one routed expert of one layer, as stored
  double kv_bytes_per_token = 0;             // MLA latent rows of all MLA layers
  double state_bytes_per_seq = 0;            // KDA recurrent + conv state of all KDA layers
  double seq_bytes = 0;                      // one sequence at in.context tokens
  int64_t moe_layers = 0;
  // placement
  TierBytes vram, ram;
  double disk_expert_bytes = 0;      // routed experts left on disk (mmap), served through the RAM cache
  int64_t gpu_expert_layers = 0;     // MoE layers whose experts fit in VRAM (the last ones)
  int64_t cpu_expert_layers = 0;     // MoE layers whose experts stay on the host
  bool embedding_on_host = false;    // the embedding table moved to RAM to make room (a row lookup per token)
  double expert_hit_rate = 1;        // fraction of host expert reads served from RAM
  std::string hit_rate_origin;
  bool fits = false;
  std::string why_not;
  std::vector<std::string> flags;    // k3 options that realise the placement
  std::vector<std::string> notes;
  // speed
  PhaseTimes decode, prefill;
  double decode_tok_s_serial = 0, decode_tok_s_overlapped = 0;   // per sequence at in.batch
  double prefill_tok_s_cpu_experts = 0;       // host experts computed by the CPU
  double prefill_tok_s_streamed = 0;          // host experts streamed over PCIe and computed on the GPU
  int64_t stream_from_tokens = 0;             // smallest chunk (power of two) where streaming wins; 0: never up to 65536
};

OffloadPlan make_offload_plan(const OffloadInput& in);
std::string format_offload_table(const OffloadPlan& p);
nlohmann::json offload_to_json(const OffloadPlan& p);

}  // namespace k3::plan
