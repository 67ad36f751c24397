// `k3 info -m DIR`: architecture, parameter counts, weight bytes, cache and state sizes.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "k3/model/model.h"
#include "k3/model/model_stats.h"

namespace k3cli {

void add_info(CLI::App& app, Registry& reg) {
  auto* cmd = app.add_subcommand("info", "Print a model's architecture and sizes");
  auto model = std::make_shared<std::string>();
  cmd->add_option("-m,--model", *model, "HF checkpoint directory");
  cmd->callback([&reg, model] {
    reg.action = [model] {
      auto m = k3::Model::load(resolve_model_dir(*model));
      const auto& c = m->config();
      const auto s = k3::compute_stats(c);
      std::printf("model            %s\n", m->checkpoint().dir().c_str());
      std::printf("architecture     %s (%s)\n", c.arch_name().c_str(), c.arch == k3::Arch::KimiK3 ? "Kimi K3" : "Kimi-Linear");
      std::printf("layers           %lld (%lld KDA + %lld MLA), hidden %lld, vocab %lld\n", (long long)c.num_layers,
                  (long long)c.num_kda_layers(), (long long)c.num_mla_layers(), (long long)c.hidden_size, (long long)c.vocab_size);
      std::printf("moe              %lld experts, top-%lld, %lld shared, expert FFN %lld%s\n", (long long)c.num_experts,
                  (long long)c.top_k, (long long)c.num_shared_experts, (long long)c.moe_intermediate_size,
                  c.routed_hidden_size ? (", latent " + std::to_string(c.routed_hidden_size)).c_str() : "");
      std::printf("residual         %s\n", c.attn_res_block_size ? ("block attention residuals, block " + std::to_string(c.attn_res_block_size)).c_str() : "pre-norm residual");
      std::printf("routed experts   %s\n", (c.expert_quant_format ? std::string(weight_format_name(*c.expert_quant_format)) + " (compressed-tensors)" : std::string("dense floats")).c_str());
      std::printf("params total     %s (%lld)\n", human_count((double)s.params_total).c_str(), (long long)s.params_total);
      std::printf("params active    %s per token (%lld)\n", human_count((double)s.params_active).c_str(), (long long)s.params_active);
      std::printf("weight bytes     %s (%lld tensors bound, %lld unused in checkpoint)\n",
                  human_bytes((double)m->weights().bound_bytes).c_str(), (long long)m->checkpoint().all().size() - (long long)m->weights().unused_tensors,
                  (long long)m->weights().unused_tensors);
      std::printf("cache per token  %s bf16 / %s fp8 (%lld MLA latent values)\n", human_bytes(2.0 * s.mla_cache_values_per_token).c_str(),
                  human_bytes(1.0 * s.mla_cache_values_per_token).c_str(), (long long)s.mla_cache_values_per_token);
      std::printf("state per seq    %s fp32 KDA state + %s conv state\n", human_bytes((double)s.kda_state_bytes_f32).c_str(),
                  human_bytes(4.0 * s.kda_conv_state_values).c_str());
      return 0;
    };
  });
}

}  // namespace k3cli
