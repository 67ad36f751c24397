#include "k3/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "k3/core/error.h"
#include "k3/engine/sampler.h"
#include "k3/engine/stop_matcher.h"
#include "k3/text/stream_decoder.h"

namespace k3::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateResult generate(const ModelRunner& model, const text::Tokenizer& tok, std::span<const int32_t> prompt,
                        const SamplingParams& params, const std::function<void(std::string_view)>& on_text,
                        const GenerateOptions& opt) {
  params.validate();
  if (prompt.empty()) throw Error("empty prompt: at least one token is needed");
  const auto& cfg = model.config();
  std::vector<int32_t> stop_ids = params.stop_token_ids;
  if (!params.ignore_eos) {
    if (cfg.eos_token_id >= 0) stop_ids.push_back(static_cast<int32_t>(cfg.eos_token_id));
    if (tok.eos_id() >= 0) stop_ids.push_back(tok.eos_id());
  }

  GenerateResult res;
  res.prompt_tokens = static_cast<int64_t>(prompt.size());
  Sampler sampler(params, opt.default_seed);
  StopMatcher stops(params.stop);
  text::StreamDecoder detok(tok);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };

  auto st_owner = model.new_cache();
  SequenceCache& st = *st_owner;
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(opt.prefill_chunk)) {
    const size_t n = std::min(prompt.size() - i, static_cast<size_t>(opt.prefill_chunk));
    model.forward(prompt.subspan(i, n), st, logits);
  }
  res.prefill_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  res.finish_reason = "length";
  bool stopped = false;
  while (static_cast<int>(res.tokens.size()) < params.max_tokens) {
    mask_untokenizable(logits, tok.n_vocab());
    const int32_t id = sampler.sample(logits, prompt, res.tokens);
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
      res.finish_reason = "stop";
      stopped = true;
      break;
    }
    res.tokens.push_back(id);
    auto r = stops.push(detok.push(id));
    emit(r.emit);
    if (r.stopped) {
      res.finish_reason = "stop";
      stopped = true;
      break;
    }
    if (static_cast<int>(res.tokens.size()) == params.max_tokens) break;
    model.forward(std::span<const int32_t>(&res.tokens.back(), 1), st, logits);
  }
  if (!stopped || !stops.stopped()) {
    auto r = stops.push(detok.flush());
    emit(r.emit);
    if (r.stopped)
      res.finish_reason = "stop";
    else
      emit(stops.flush());
  }
  res.decode_seconds = seconds_since(t0);
  return res;
}

}  // namespace k3::engine
