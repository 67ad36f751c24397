#include "k3/engine/sampling_params.h"

#include <cmath>
#include <sstream>

#include "k3/core/error.h"

namespace k3::engine {

namespace {

[[noreturn]] void bad(const char* field, const std::string& range, const std::string& got) {
  throw k3::Error(std::string("SamplingParams: ") + field + " must be " + range + ", got " + got);
}

std::string fstr(float v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    bad("temperature", "a finite value >= 0 (0 = greedy)", fstr(temperature));
  if (top_k < -1) bad("top_k", ">= -1 (0 or -1 = disabled)", std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", "in (0, 1]", fstr(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "in [0, 1]", fstr(min_p));
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f))
    bad("repetition_penalty", "a finite value > 0 (1 = disabled)", fstr(repetition_penalty));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    bad("presence_penalty", "in [-2, 2]", fstr(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    bad("frequency_penalty", "in [-2, 2]", fstr(frequency_penalty));
  if (max_tokens < 0) bad("max_tokens", ">= 0", std::to_string(max_tokens));
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty()) bad("stop", "a list of non-empty strings", "an empty string at index " + std::to_string(i));
  if (logit_bias_ids.size() != logit_bias_values.size())
    bad("logit_bias", "pairs of an id and a value", "lists of different lengths");
  for (size_t i = 0; i < logit_bias_ids.size(); ++i) {
    if (logit_bias_ids[i] < 0 || (i > 0 && logit_bias_ids[i] <= logit_bias_ids[i - 1]))
      bad("logit_bias", "distinct token ids >= 0, sorted", std::to_string(logit_bias_ids[i]));
    if (!(logit_bias_values[i] >= -100.0f && logit_bias_values[i] <= 100.0f))
      bad("logit_bias", "values in [-100, 100]", fstr(logit_bias_values[i]));
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i)
    if (stop_token_ids[i] < 0)
      bad("stop_token_ids", "a list of token ids >= 0",
          std::to_string(stop_token_ids[i]) + " at index " + std::to_string(i));
}

}  // namespace k3::engine
