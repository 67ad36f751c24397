#include "k3/plan/offload_plan.h"

#include <algorithm>
#include <cmath>

#include "k3/core/error.h"
#include "k3/model/model_stats.h"
#include "k3/plan/embedded_data.h"
#include "k3/plan/text_format.h"
#include "k3/runtime/cache_spec.h"

namespace k3::plan {

using nlohmann::json;

// ---------------------------------------------------------------- hosts table

std::vector<HostSpec> parse_hosts(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(source + ": not valid JSON: " + e.what());
  }
  std::vector<HostSpec> out;
  if (!j.is_object() || !j.contains("hosts")) return out;
  if (!j["hosts"].is_object()) throw Error(source + ": 'hosts' must be an object");
  for (auto& item : j["hosts"].items()) {  // not a structured binding: clang < 16 cannot capture one
    const std::string& key = item.key();
    const json& e = item.value();
    const std::string where = source + ": host '" + key + "'";
    if (!e.is_object()) throw Error(where + ": must be an object");
    auto num = [&](const char* f) {
      if (!e.contains(f) || !e[f].is_number() || !(e[f].get<double>() > 0))
        throw Error(where + ": field '" + std::string(f) + "' is required and must be a positive number");
      return e[f].get<double>();
    };
    HostSpec h;
    h.key = key;
    h.name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : key;
    if (!e.contains("source") || !e["source"].is_string() || e["source"].get<std::string>().empty())
      throw Error(where + ": field 'source' (where the numbers come from) is required");
    h.source = e["source"].get<std::string>();
    h.ram_gb = num("ram_gb");
    h.dram_gb_s = num("dram_gb_s");
    h.cpu_tflops = num("cpu_tflops");
    h.pcie_gb_s = num("pcie_gb_s");
    h.disk_gb_s = num("disk_gb_s");
    out.push_back(std::move(h));
  }
  return out;
}

const std::vector<HostSpec>& builtin_hosts() {
  static const std::vector<HostSpec> table = parse_hosts(std::string(embedded_hardware_json()), "resources/hardware.json");
  return table;
}

HostSpec find_host(const std::vector<HostSpec>& table, const std::string& key) {
  std::string known;
  for (auto& h : table) {
    if (h.key == key) return h;
    known += (known.empty() ? "" : ", ") + h.key;
  }
  throw Error("unknown --host '" + key + "' (known: " + known + ")");
}

double PhaseTimes::overlapped() const { return std::max(gpu, cpu + disk) + pcie; }

// ---------------------------------------------------------------- placement

namespace {

// --n-cpu-moe N keeps the experts of the layers with index < N on the CPU: the smallest N that covers
// the first `cpu_layers` MoE layers.
int64_t n_cpu_moe_flag(const ModelConfig& c, int64_t cpu_layers) {
  int64_t seen = 0;
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.is_moe_layer(l) && ++seen == cpu_layers) return l + 1;
  return c.num_layers;
}

// VRAM: caches, workspace and the non-expert weights first (every token needs them), then whole
// layers of routed experts, the last layers first (--n-cpu-moe keeps the first ones on the host).
void place_on_gpu(OffloadPlan& p, const Hardware& gpu) {
  const double usable = gpu.memory_gb * 1e9 * p.in.mem_util;
  p.vram.cache = (double)p.in.batch * p.seq_bytes;
  p.vram.workspace = workspace_bytes(p.in.config, p.in.prefill_chunk, 1);
  p.vram.non_expert = p.weights.non_expert();
  if (p.vram.total() > usable && p.weights.embedding > 0) {
    p.embedding_on_host = true;  // a lookup of one row per token: nearly free from RAM
    p.vram.non_expert -= p.weights.embedding;
    p.ram.non_expert += p.weights.embedding;
  }
  if (p.vram.total() > usable) {
    p.why_not = fmt("the GPU's usable %.1f GB cannot hold the non-expert weights (%.1f GB) + caches for %lld x %lld tokens "
                    "(%.1f GB) + workspace (%.1f GB): take a larger GPU, fewer/shorter sequences, or --device cpu",
                    usable / 1e9, p.vram.non_expert / 1e9, (long long)p.in.batch, (long long)p.in.context,
                    p.vram.cache / 1e9, p.vram.workspace / 1e9);
    return;
  }
  const double layer_bytes = (double)p.in.config.num_experts * p.expert_bytes_per_expert_layer;
  p.gpu_expert_layers = layer_bytes > 0 ? std::min<int64_t>(p.moe_layers, (int64_t)((usable - p.vram.total()) / layer_bytes)) : 0;
  p.vram.experts = (double)p.gpu_expert_layers * layer_bytes;
  p.cpu_expert_layers = p.moe_layers - p.gpu_expert_layers;
}

// RAM: what the GPU left (or, CPU only, everything), then experts up to the budget; the rest of the
// experts stay in the checkpoint on disk and are paged in through the RAM expert cache.
void place_on_host(OffloadPlan& p, bool cpu_only) {
  const double budget = p.in.host.ram_gb * 1e9 * p.in.ram_util;
  if (cpu_only) {
    p.ram.non_expert = p.weights.non_expert();
    p.ram.cache = (double)p.in.batch * p.seq_bytes;
    p.ram.workspace = workspace_bytes(p.in.config, p.in.prefill_chunk, 1);
    p.cpu_expert_layers = p.moe_layers;
  }
  const double host_experts = (double)p.cpu_expert_layers * (double)p.in.config.num_experts * p.expert_bytes_per_expert_layer;
  if (p.ram.total() > budget) {
    p.why_not = fmt("RAM budget %.1f GB (%.0f GB x %.2f) cannot hold the non-expert weights and caches (%.1f GB)",
                    budget / 1e9, p.in.host.ram_gb, p.in.ram_util, p.ram.total() / 1e9);
    return;
  }
  p.ram.experts = std::min(host_experts, budget - p.ram.total());
  p.disk_expert_bytes = host_experts - p.ram.experts;
  if (p.in.expert_hit_rate) {
    p.expert_hit_rate = *p.in.expert_hit_rate;
    p.hit_rate_origin = "--expert-hit-rate";
  } else {
    p.expert_hit_rate = host_experts > 0 ? p.ram.experts / host_experts : 1;
    p.hit_rate_origin = "uniform routing: the RAM share of the host's experts (skewed real routing hits more)";
  }
}

void add_flags(OffloadPlan& p, bool cpu_only) {
  const auto& c = p.in.config;
  p.flags.push_back(cpu_only ? "--device cpu" : "--device cuda");
  if (!cpu_only && p.cpu_expert_layers == p.moe_layers && p.moe_layers > 0) p.flags.push_back("--cpu-moe");
  else if (!cpu_only && p.cpu_expert_layers > 0) p.flags.push_back(fmt("--n-cpu-moe %lld", (long long)n_cpu_moe_flag(c, p.cpu_expert_layers)));
  if (p.embedding_on_host) p.flags.push_back("-ot 'embed_tokens\\.=CPU'");
  p.flags.push_back(fmt("--max-model-len %lld --max-num-seqs %lld", (long long)p.in.context, (long long)p.in.batch));
  if (p.disk_expert_bytes > 0)
    p.notes.push_back(fmt("bigger than RAM: %.1f GB of routed experts stay in the checkpoint and are read on demand "
                          "(the page cache keeps the hot ones); keep the checkpoint on the fastest drive",
                          p.disk_expert_bytes / 1e9));
}

// ---------------------------------------------------------------- speed

// One step of `tokens` tokens (a decode step of `tokens` sequences, or a prefill chunk): roofline time
// per tier with the host's experts computed on the CPU.
PhaseTimes step_times(const OffloadPlan& p, const TokenCosts& tc, double tokens, bool prefill, bool cpu_only) {
  const auto& c = p.in.config;
  const double K = (double)c.top_k;
  const double eb = p.expert_bytes_per_expert_layer, D = distinct_experts(c, tokens);
  const double non_expert_read = p.weights.non_expert() - p.weights.embedding;
  const double cache_read = prefill ? 0 : tokens * ((double)p.in.context * p.kv_bytes_per_token + 2.0 * p.state_bytes_per_seq);
  const double other = tokens * (prefill ? tc.other_flops_prefill + tc.attn_prefill : tc.other_flops_decode + tc.attn_decode);
  const double host_expert_bytes = (double)p.cpu_expert_layers * D * eb;
  const double host_expert_flops = tokens * K * tc.expert_flops * (double)p.cpu_expert_layers;
  const auto& h = p.in.host;
  PhaseTimes t;
  if (cpu_only) {
    t.cpu = std::max((non_expert_read + cache_read + host_expert_bytes) / (h.dram_gb_s * 1e9),
                     (other + host_expert_flops) / (h.cpu_tflops * 1e12));
  } else {
    const Hardware& g = *p.in.gpu;
    const double gpu_bytes = non_expert_read + cache_read + (double)p.gpu_expert_layers * D * eb;
    const double gpu_flops = other + tokens * K * tc.expert_flops * (double)p.gpu_expert_layers;
    t.gpu = std::max(gpu_bytes / (g.hbm_tb_s * 1e12), gpu_flops / (g.bf16_tflops * 1e12));
    t.cpu = std::max(host_expert_bytes / (h.dram_gb_s * 1e9), host_expert_flops / (h.cpu_tflops * 1e12));
    // Each host MoE layer: fp32 activations + routing (ids, weights) down, fp32 results up.
    const double crossing = tokens * (tc.expert_in * 4 + K * 8);
    t.pcie = (double)p.cpu_expert_layers * (2 * crossing / (h.pcie_gb_s * 1e9) + 2 * p.in.pcie_sync_us * 1e-6);
  }
  t.disk = host_expert_bytes * (1 - p.expert_hit_rate) / (h.disk_gb_s * 1e9);
  return t;
}

// The same prefill chunk with the host's experts streamed to the GPU (packed, as stored) and computed
// there; transfers overlap the GPU's work layer by layer.
double streamed_prefill_s(const OffloadPlan& p, const TokenCosts& tc, double tokens) {
  const auto& c = p.in.config;
  const Hardware& g = *p.in.gpu;
  const double D = distinct_experts(c, tokens);
  const double moved = (double)p.cpu_expert_layers * D * p.expert_bytes_per_expert_layer;
  const double gpu = tokens * (tc.other_flops_prefill + tc.attn_prefill + (double)c.top_k * tc.expert_flops * (double)p.moe_layers);
  const double t_gpu = std::max(gpu / (g.bf16_tflops * 1e12), (p.weights.non_expert() - p.weights.embedding) / (g.hbm_tb_s * 1e12));
  const double t_disk = moved * (1 - p.expert_hit_rate) / (p.in.host.disk_gb_s * 1e9);
  return std::max(t_gpu, moved / (p.in.host.pcie_gb_s * 1e9)) + t_disk;
}

}  // namespace

OffloadPlan make_offload_plan(const OffloadInput& in) {
  if (in.context < 1) throw Error("--context must be at least 1");
  if (in.batch < 1) throw Error("--batch must be at least 1");
  if (in.prefill_chunk < 1) throw Error("--chunk must be at least 1");
  if (!(in.mem_util > 0 && in.mem_util <= 1)) throw Error("--mem-util must be in (0, 1]");
  if (!(in.ram_util > 0 && in.ram_util <= 1)) throw Error("--ram-util must be in (0, 1]");
  if (in.expert_hit_rate && !(*in.expert_hit_rate >= 0 && *in.expert_hit_rate <= 1))
    throw Error("--expert-hit-rate must be in [0, 1]");
  const ModelConfig& c = in.config;
  OffloadPlan p;
  p.in = in;
  if (in.gpu && in.gpu->pcie_gb_s && *in.gpu->pcie_gb_s < in.host.pcie_gb_s) {
    p.in.host.pcie_gb_s = *in.gpu->pcie_gb_s;  // the slower end of the link sets the rate
    p.notes.push_back(fmt("PCIe: the GPU's link (%.1f GB/s) is slower than the host's (%.1f GB/s); using the GPU's",
                          *in.gpu->pcie_gb_s, in.host.pcie_gb_s));
  }
  p.weights = weight_bytes(c);
  p.moe_layers = num_moe_layers(c);
  p.expert_bytes_per_expert_layer = 3 * (double)c.expert_in_dim() * (double)c.moe_intermediate_size * expert_bytes_per_param(c);
  const CacheSpec spec = make_cache_spec(c, in.kv_dtype, in.state_dtype);
  p.kv_bytes_per_token = (double)spec.bytes_per_token();
  p.state_bytes_per_seq = (double)(spec.kda_layers * spec.kda_state_bytes()) + (double)(spec.kda_layers * 3 * spec.kda_conv_floats * 4);
  p.seq_bytes = (double)in.context * p.kv_bytes_per_token + p.state_bytes_per_seq;

  const bool cpu_only = !in.gpu.has_value();
  if (!cpu_only) place_on_gpu(p, *in.gpu);
  if (p.why_not.empty()) place_on_host(p, cpu_only);
  p.fits = p.why_not.empty();
  if (!p.fits) return p;
  add_flags(p, cpu_only);

  const TokenCosts tc = token_costs(c, in.context);
  p.decode = step_times(p, tc, (double)in.batch, false, cpu_only);
  p.decode_tok_s_serial = 1.0 / p.decode.serial();
  p.decode_tok_s_overlapped = 1.0 / p.decode.overlapped();
  const double T = (double)in.prefill_chunk;
  p.prefill = step_times(p, tc, T, true, cpu_only);
  p.prefill_tok_s_cpu_experts = T / p.prefill.serial();
  if (!cpu_only && p.cpu_expert_layers > 0) {
    p.prefill_tok_s_streamed = T / streamed_prefill_s(p, tc, T);
    for (int64_t n = 1; n <= 65536; n *= 2)
      if (streamed_prefill_s(p, tc, (double)n) < step_times(p, tc, (double)n, true, false).serial()) {
        p.stream_from_tokens = n;
        break;
      }
  }
  return p;
}

// ---------------------------------------------------------------- output

std::string format_offload_table(const OffloadPlan& p) {
  const auto& c = p.in.config;
  const auto& h = p.in.host;
  std::string o;
  auto row = [&](const std::string& k, const std::string& v) { o += fmt("  %-34s %s\n", k.c_str(), v.c_str()); };
  o += fmt("k3 plan: %s on %s%s\n", c.source.c_str(), p.in.gpu ? (p.in.gpu->name + " + ").c_str() : "", h.name.c_str());
  o += fmt("  context %lld tokens x %lld sequences, KV %s, KDA state %s, VRAM utilisation %.2f, RAM utilisation %.2f\n",
           (long long)p.in.context, (long long)p.in.batch, cache_dtype_name(p.in.kv_dtype), cache_dtype_name(p.in.state_dtype),
           p.in.mem_util, p.in.ram_util);
  o += "\nPLACEMENT\n";
  row("weights as stored", bytes_h(p.weights.total()) + fmt("  (routed experts %s in %lld MoE layers, other %s)",
                                                           bytes_h(p.weights.routed_experts).c_str(), (long long)p.moe_layers,
                                                           bytes_h(p.weights.non_expert()).c_str()));
  if (!p.fits) {
    row("verdict", "DOES NOT FIT: " + p.why_not);
    return o + "\nhost source: " + h.source + "\n";
  }
  if (p.in.gpu)
    row(fmt("VRAM (%s)", p.in.gpu->name.c_str()),
        bytes_h(p.vram.total()) + fmt("  (non-expert %s, experts of %lld MoE layers %s, cache %s, workspace %s)",
                                      bytes_h(p.vram.non_expert).c_str(), (long long)p.gpu_expert_layers,
                                      bytes_h(p.vram.experts).c_str(), bytes_h(p.vram.cache).c_str(), bytes_h(p.vram.workspace).c_str()));
  row(fmt("RAM (%.0f GB)", h.ram_gb),
      bytes_h(p.ram.total()) + fmt("  (experts of %lld MoE layers: %s resident%s%s)", (long long)p.cpu_expert_layers,
                                   bytes_h(p.ram.experts).c_str(), p.ram.non_expert > 0 ? fmt(", non-expert %s", bytes_h(p.ram.non_expert).c_str()).c_str() : "",
                                   p.ram.cache > 0 ? fmt(", cache %s", bytes_h(p.ram.cache).c_str()).c_str() : ""));
  row("disk (checkpoint, mmap)", p.disk_expert_bytes > 0 ? bytes_h(p.disk_expert_bytes) + " of experts read on demand" : "nothing read after load");
  row("expert RAM hit rate", fmt("%.1f%% (%s)", 100 * p.expert_hit_rate, p.hit_rate_origin.c_str()));
  std::string flags;
  for (auto& f : p.flags) flags += (flags.empty() ? "" : " ") + f;
  row("k3 flags", flags);
  for (auto& n : p.notes) o += "  note: " + n + "\n";

  o += "\nSPEED (ROOFLINE: each phase at its bandwidth or compute bound, no kernel overheads)\n";
  auto phases = [&](const PhaseTimes& t) {
    return fmt("GPU %.2f ms, CPU %.2f ms, disk %.2f ms, PCIe %.2f ms", t.gpu * 1e3, t.cpu * 1e3, t.disk * 1e3, t.pcie * 1e3);
  };
  row(fmt("decode step, batch %lld", (long long)p.in.batch), phases(p.decode));
  row("decode per sequence", fmt("%.1f tok/s phases in series, %.1f tok/s with GPU/CPU fully overlapped",
                                 p.decode_tok_s_serial, p.decode_tok_s_overlapped));
  row("decode aggregate", fmt("%.1f - %.1f tok/s", p.decode_tok_s_serial * (double)p.in.batch,
                              p.decode_tok_s_overlapped * (double)p.in.batch));
  row(fmt("prefill chunk of %lld", (long long)p.in.prefill_chunk), phases(p.prefill));
  row("prefill, experts on the CPU", fmt("%.0f tok/s", p.prefill_tok_s_cpu_experts));
  if (p.prefill_tok_s_streamed > 0) {
    row("prefill, experts streamed to GPU", fmt("%.0f tok/s (PCIe %.0f GB/s)", p.prefill_tok_s_streamed, h.pcie_gb_s));
    row("streaming pays from", p.stream_from_tokens > 0 ? fmt("%lld tokens per chunk", (long long)p.stream_from_tokens)
                                                        : std::string("never up to 65536 tokens"));
  }
  o += fmt("\nhost: %s (RAM %.0f GB, DRAM %.0f GB/s, CPU %.1f TFLOP/s, PCIe %.0f GB/s, disk %.1f GB/s)\nhost source: %s\n",
           h.name.c_str(), h.ram_gb, h.dram_gb_s, h.cpu_tflops, h.pcie_gb_s, h.disk_gb_s, h.source.c_str());
  if (p.in.gpu) o += "gpu source: " + p.in.gpu->source + "\n";
  return o;
}

json offload_to_json(const OffloadPlan& p) {
  const auto& h = p.in.host;
  auto tier = [](const TierBytes& t) {
    return json{{"non_expert", t.non_expert}, {"experts", t.experts}, {"cache", t.cache}, {"workspace", t.workspace}, {"total", t.total()}};
  };
  auto phases = [](const PhaseTimes& t) {
    return json{{"gpu_s", t.gpu}, {"cpu_s", t.cpu}, {"disk_s", t.disk}, {"pcie_s", t.pcie}, {"serial_s", t.serial()}, {"overlapped_s", t.overlapped()}};
  };
  json j;
  j["model"] = {{"source", p.in.config.source}, {"arch", p.in.config.arch_name()}, {"weights_total_bytes", p.weights.total()},
                {"routed_expert_bytes", p.weights.routed_experts}, {"moe_layers", p.moe_layers}};
  j["host"] = {{"key", h.key}, {"name", h.name}, {"ram_gb", h.ram_gb}, {"dram_gb_s", h.dram_gb_s}, {"cpu_tflops", h.cpu_tflops},
               {"pcie_gb_s", h.pcie_gb_s}, {"disk_gb_s", h.disk_gb_s}, {"source", h.source}};
  j["gpu"] = p.in.gpu ? json{{"key", p.in.gpu->key}, {"name", p.in.gpu->name}, {"memory_gb", p.in.gpu->memory_gb}} : json(nullptr);
  j["fits"] = p.fits;
  j["why_not"] = p.why_not;
  j["placement"] = {{"vram", tier(p.vram)}, {"ram", tier(p.ram)}, {"disk_expert_bytes", p.disk_expert_bytes},
                    {"gpu_expert_layers", p.gpu_expert_layers}, {"cpu_expert_layers", p.cpu_expert_layers},
                    {"embedding_on_host", p.embedding_on_host}, {"expert_hit_rate", p.expert_hit_rate},
                    {"hit_rate_origin", p.hit_rate_origin}, {"flags", p.flags}, {"notes", p.notes}};
  j["speed"] = {{"batch", p.in.batch}, {"decode", phases(p.decode)}, {"decode_tok_s_serial", p.decode_tok_s_serial},
                {"decode_tok_s_overlapped", p.decode_tok_s_overlapped}, {"prefill_chunk", p.in.prefill_chunk},
                {"prefill", phases(p.prefill)}, {"prefill_tok_s_cpu_experts", p.prefill_tok_s_cpu_experts},
                {"prefill_tok_s_streamed", p.prefill_tok_s_streamed}, {"stream_from_tokens", p.stream_from_tokens}};
  return j;
}

}  // namespace k3::plan
