#include "cli/speculative_option.h"

#include <cstdio>

#ifdef K3_HAVE_CUDA
#include "k3/backend/cuda/cuda_drafter.h"
#include "k3/backend/cuda/cuda_model.h"
#endif

namespace k3cli {

void add_speculative_option(CLI::App* cmd, std::string& json) {
  cmd->add_option("--speculative-config", json,
                  "speculative decoding, as vLLM: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                  "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' or '{\"method\": \"draft_model\", \"model\": "
                  "\"DIR\", \"num_speculative_tokens\": 4}' or '{\"method\": \"block_drafter\", \"model\": \"DRAFTER_DIR\", "
                  "\"num_speculative_tokens\": 4}' (docs/serving.md)");
}

std::unique_ptr<k3::ModelRunner> load_draft_model(const std::optional<k3::engine::SpeculativeConfig>& spec,
                                                  const DeviceOptions& dev) {
  if (!spec || spec->method != "draft_model") return nullptr;
  DeviceOptions d = dev;
  d.tokenizer.clear();  // the draft's own directory; its vocabulary is checked against the target's
  return load_model(spec->model, d);
}

std::unique_ptr<k3::drafter::BlockDrafter> load_block_drafter(const std::optional<k3::engine::SpeculativeConfig>& spec,
                                                             const std::string& target_path, const DeviceOptions& dev,
                                                             const k3::ModelRunner& target) {
  if (!spec || spec->method != "block_drafter") return nullptr;
  auto d = k3::drafter::BlockDrafter::load(spec->model, target_path);
  if (dev.device.rfind("cuda", 0) == 0) {
#ifdef K3_HAVE_CUDA
    // load_model has accepted the device string: "cuda" or "cuda:N".
    const int ordinal = dev.device.size() > 5 ? std::stoi(dev.device.substr(5)) : 0;
    const auto* gpu = dynamic_cast<const k3::cuda::CudaModel*>(&target);
    d->set_runner(k3::cuda::make_cuda_drafter_runner(d->config(), d->weights(), ordinal, gpu ? &gpu->device_weights() : nullptr));
#else
    (void)target;
#endif
  }
  return d;
}

std::string spec_decode_summary(const k3::engine::EngineStats& st) {
  const double drafts = static_cast<double>(st.spec_num_drafts), tokens = static_cast<double>(st.spec_num_draft_tokens),
               acc = static_cast<double>(st.spec_num_accepted_tokens);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%lld drafts, %lld draft tokens, %lld accepted (%.1f%%), mean acceptance length %.2f",
                static_cast<long long>(st.spec_num_drafts), static_cast<long long>(st.spec_num_draft_tokens),
                static_cast<long long>(st.spec_num_accepted_tokens), tokens > 0 ? 100.0 * acc / tokens : 0.0,
                drafts > 0 ? 1.0 + acc / drafts : 0.0);
  return buf;
}

}  // namespace k3cli
