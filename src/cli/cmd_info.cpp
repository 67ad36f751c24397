// `k3 info -m DIR|GGUF|CONFIG.json`: architecture, parameter counts, weight bytes, cache and state sizes (a bare
// config: everything but the weight bytes, before any download).
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/compute_options.h"
#include "k3/backend/cpu/cpu_isa.h"
#include "k3/io/regular_file.h"
#include "k3/model/config.h"
#include "k3/model/model.h"
#include "k3/model/model_stats.h"
#include "k3/runtime/cache_spec.h"

namespace k3cli {

namespace {
// The CPU, its features, the kernel tier chosen (cpu_isa.h) and the compute threads.
void print_cpu_lines() {
  const k3::cpu::CpuState& cpu = k3::cpu::cpu_state();
  std::printf("cpu              %s\n", cpu.features.model_name[0] ? cpu.features.model_name : "(no brand string)");
  std::printf("cpu features     %s (AMX tile data: %s)\n", k3::cpu::feature_names(cpu.features).c_str(), cpu.amx_status.c_str());
  std::printf("cpu kernels      %s: %s\n", k3::cpu::isa_name(cpu.choice.isa), cpu.choice.reason.c_str());
  std::printf("threads          %s\n", compute_threads_summary().c_str());
}
// The architecture and its sizes, from the config alone.
void print_config_lines(const k3::ModelConfig& c) {
  const auto s = k3::compute_stats(c);
  std::printf("architecture     %s (%s)\n", c.arch_name().c_str(), c.arch == k3::Arch::KimiK3 ? "Kimi K3" : "Kimi-Linear");
  std::printf("layers           %lld (%lld KDA + %lld MLA), hidden %lld, vocab %lld\n", (long long)c.num_layers,
              (long long)c.num_kda_layers(), (long long)c.num_mla_layers(), (long long)c.hidden_size, (long long)c.vocab_size);
  std::printf("moe              %lld experts, top-%lld, %lld shared, expert FFN %lld%s\n", (long long)c.num_experts,
              (long long)c.top_k, (long long)c.num_shared_experts, (long long)c.moe_intermediate_size,
              c.routed_hidden_size ? (", latent " + std::to_string(c.routed_hidden_size)).c_str() : "");
  std::printf("residual         %s\n", c.attn_res_block_size ? ("block attention residuals, block " + std::to_string(c.attn_res_block_size)).c_str() : "pre-norm residual");
  std::printf("routed experts   %s\n", (c.expert_quant_format ? std::string(weight_format_name(*c.expert_quant_format)) + (*c.expert_quant_format == k3::WeightFormat::MXFP4_GGML ? " (GGUF ggml blocks)" : " (compressed-tensors)") : std::string("dense floats")).c_str());
  std::printf("params total     %s (%lld)\n", human_count((double)s.params_total).c_str(), (long long)s.params_total);
  std::printf("params active    %s per token (%lld)\n", human_count((double)s.params_active).c_str(), (long long)s.params_active);
}

// What the cache allocates (runtime/cache_spec.h), per --kv-cache-dtype / --mamba-ssm-cache-dtype.
void print_cache_lines(const k3::ModelConfig& c) {
  const k3::CacheSpec f32 = k3::make_cache_spec(c), bf16 = k3::make_cache_spec(c, k3::CacheDType::BF16, k3::CacheDType::BF16),
                      fp8 = k3::make_cache_spec(c, k3::CacheDType::FP8_E4M3);
  std::printf("cache per token  %s float32 / %s bf16 / %s fp8 (%lld MLA layers x %lld latent values)\n",
              human_bytes((double)f32.bytes_per_token()).c_str(), human_bytes((double)bf16.bytes_per_token()).c_str(),
              human_bytes((double)fp8.bytes_per_token()).c_str(), (long long)c.num_mla_layers(), (long long)c.mla_cache_dim());
  std::printf("state per seq    %s float32 / %s bfloat16 KDA state + %s fp32 conv state\n",
              human_bytes((double)(f32.kda_layers * f32.kda_state_bytes())).c_str(),
              human_bytes((double)(bf16.kda_layers * bf16.kda_state_bytes())).c_str(),
              human_bytes((double)(f32.kda_layers * 3 * f32.kda_conv_floats * 4)).c_str());
}

// A bare config (a *.json file, e.g. resources/presets/kimi-k3.json, or a directory holding config.json and no
// weights): what the model would be, before any download. Empty: a checkpoint or GGUF to load.
std::optional<k3::ModelConfig> config_only(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && fs::path(path).extension() == ".json")
    return k3::parse_model_config(k3::read_regular_file(path, size_t{16} << 20, "config"), path);
  if (!fs::is_directory(path, ec) || !fs::exists(fs::path(path) / "config.json", ec)) return std::nullopt;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json") return std::nullopt;
  return k3::load_model_config(path);
}
}  // namespace

void add_info(CLI::App& app, Registry& reg) {
  auto* cmd = app.add_subcommand("info", "Print a model's architecture and sizes");
  auto model = std::make_shared<std::string>();
  auto compute = std::make_shared<ComputeOptions>();
  cmd->add_option("-m,--model", *model, "HF checkpoint directory or GGUF file");
  add_compute_options(cmd, *compute);
  cmd->callback([&reg, model, compute] {
    reg.action = [model, compute] {
      apply_compute_options(*compute);
      const std::string path = resolve_model_dir(*model);
      if (const auto c = config_only(path)) {
        std::printf("model            %s (config only: no weights read)\n", path.c_str());
        print_config_lines(*c);
        print_cache_lines(*c);
        print_cpu_lines();
        return 0;
      }
      auto m = k3::Model::load(path);
      const auto& c = m->config();
      std::printf("model            %s\n", m->checkpoint().dir().c_str());
      print_config_lines(c);
      std::printf("weight bytes     %s (%lld tensors bound, %lld unused in checkpoint)\n",
                  human_bytes((double)m->weights().bound_bytes).c_str(), (long long)m->checkpoint().all().size() - (long long)m->weights().unused_tensors,
                  (long long)m->weights().unused_tensors);
      print_cache_lines(c);
      print_cpu_lines();
      return 0;
    };
  });
}

}  // namespace k3cli
