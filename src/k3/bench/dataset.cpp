#include "k3/bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "k3/core/error.h"
#include "k3/text/tokenizer.h"
#include "k3/text/utf8.h"

namespace k3::bench {

namespace {

int32_t pick(std::mt19937_64& rng, const std::vector<int32_t>& pool) {
  if (pool.empty()) return static_cast<int32_t>(rng() % 8192);
  return pool[rng() % pool.size()];
}

int64_t sample_len(std::mt19937_64& rng, int64_t len, double r) {
  if (r <= 0) return len;
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - r))));
  const int64_t hi = std::max(lo, static_cast<int64_t>(std::ceil(len * (1 + r))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

}  // namespace

std::vector<int32_t> sampleable_ids(const text::Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < tok.n_ranks(); ++id) {
    const std::string& b = tok.token_bytes(id);
    if (b.empty() || !text::is_valid_utf8(b)) continue;
    // Leading/trailing whitespace merges with neighbours differently; keep it simple: letters etc.
    auto re = tok.encode(b, false);
    if (re.size() == 1 && re[0] == id) ids.push_back(id);
  }
  if (ids.empty()) throw Error("the tokenizer has no sampleable token ids");
  return ids;
}

std::vector<BenchRequest> random_dataset(int64_t n, const RandomOptions& o, const std::vector<int32_t>& pool,
                                         uint64_t seed) {
  if (o.input_len < 1 || o.output_len < 1) throw Error("--input-len and --output-len must be >= 1");
  if (o.range_ratio < 0 || o.range_ratio >= 1) throw Error("--range-ratio must be in [0, 1)");
  std::mt19937_64 rng(seed);
  std::vector<int32_t> prefix(static_cast<size_t>(std::max<int64_t>(o.prefix_len, 0)));
  for (auto& t : prefix) t = pick(rng, pool);
  std::vector<BenchRequest> out(static_cast<size_t>(n));
  for (auto& r : out) {
    const int64_t in = sample_len(rng, o.input_len, o.range_ratio);
    r.output_len = sample_len(rng, o.output_len, o.range_ratio);
    r.prompt_ids = prefix;
    for (int64_t i = 0; i < in; ++i) r.prompt_ids.push_back(pick(rng, pool));
    r.prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  }
  return out;
}

std::vector<BenchRequest> prefix_repetition_dataset(int64_t n, const PrefixRepetitionOptions& o,
                                                    const std::vector<int32_t>& pool, uint64_t seed) {
  if (o.num_prefixes < 1) throw Error("--prefix-repetition-num-prefixes must be >= 1");
  if (o.output_len < 1) throw Error("--prefix-repetition-output-len must be >= 1");
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(o.num_prefixes));
  for (auto& p : prefixes) {
    p.resize(static_cast<size_t>(o.prefix_len));
    for (auto& t : p) t = pick(rng, pool);
  }
  std::vector<BenchRequest> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto& r = out[static_cast<size_t>(i)];
    r.prompt_ids = prefixes[static_cast<size_t>(i % o.num_prefixes)];
    for (int64_t k = 0; k < o.suffix_len; ++k) r.prompt_ids.push_back(pick(rng, pool));
    r.prompt_len = static_cast<int64_t>(r.prompt_ids.size());
    r.output_len = o.output_len;
  }
  std::shuffle(out.begin(), out.end(), rng);  // as vllm: prefixes interleaved
  return out;
}

std::vector<BenchRequest> sharegpt_dataset(int64_t n, const ShareGptOptions& o, const text::Tokenizer& tok,
                                           uint64_t seed) {
  std::ifstream f(o.path);
  if (!f) throw Error("cannot read the ShareGPT dataset '" + o.path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error("'" + o.path + "' is not valid JSON: " + e.what());
  }
  if (!j.is_array()) throw Error("'" + o.path + "': expected a JSON array of {conversations: [...]}");
  std::vector<size_t> order(j.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<BenchRequest> out;
  for (size_t idx : order) {
    if (static_cast<int64_t>(out.size()) >= n) break;
    const auto& e = j[idx];
    if (!e.is_object() || !e.contains("conversations") || !e["conversations"].is_array()) continue;
    const auto& c = e["conversations"];
    if (c.empty() || !c[0].is_object() || !c[0].contains("value") || !c[0]["value"].is_string()) continue;
    const bool has_ref = c.size() >= 2 && c[1].is_object() && c[1].contains("value") && c[1]["value"].is_string();
    BenchRequest r;
    r.prompt_text = c[0]["value"].get<std::string>();
    r.prompt_len = static_cast<int64_t>(tok.encode(r.prompt_text, false).size());
    if (o.output_len >= 0) r.output_len = o.output_len;
    else if (has_ref) r.output_len = static_cast<int64_t>(tok.encode(c[1]["value"].get<std::string>(), false).size());
    else r.output_len = kShareGptDefaultOutputLen;  // prompt-only files (e.g. ShareGPT_V3_filtered_1000.json)
    if (r.prompt_len < 4 || r.output_len < 1) continue;
    if (o.output_len < 0 && has_ref && (r.output_len < 4 || r.prompt_len > 1024 || r.prompt_len + r.output_len > 2048))
      continue;
    if (o.output_len >= 0 || !has_ref) {
      if (r.prompt_len > 1024) continue;
    }
    out.push_back(std::move(r));
  }
  if (static_cast<int64_t>(out.size()) < n)
    throw Error("the ShareGPT dataset has only " + std::to_string(out.size()) + " usable conversations, " +
                std::to_string(n) + " requested");
  return out;
}

void decode_prompts(std::vector<BenchRequest>& reqs, const text::Tokenizer& tok) {
  for (auto& r : reqs)
    if (!r.prompt_ids.empty()) r.prompt_text = tok.decode(r.prompt_ids);
}

}  // namespace k3::bench
