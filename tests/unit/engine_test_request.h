// A greedy-or-seeded engine request for the engine tests (test_batch_engine.cpp, test_speculative.cpp):
// EOS ignored, so every request runs to max_tokens and runs with and without a feature compare token for token.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "k3/engine/batch_engine.h"

namespace k3test {

inline k3::engine::Request make_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens, float temp = 0.f,
                                        uint64_t seed = 7) {
  k3::engine::Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.temperature = temp;
  r.params.max_tokens = max_tokens;
  r.params.seed = seed;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace k3test
