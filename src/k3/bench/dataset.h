// Request sets for `k3 bench serve` (vllm bench serve's datasets): random (token ids with exact
// lengths), sharegpt (conversations JSON), prefix-repetition (shared random prefixes + suffixes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3::text {
class Tokenizer;
}

namespace k3::bench {

struct BenchRequest {
  std::vector<int32_t> prompt_ids;  // token-id prompt (random datasets)
  std::string prompt_text;          // the text (decoded ids, or the dataset's text)
  int64_t prompt_len = 0;           // tokens as the dataset built/counted them
  int64_t output_len = 0;           // max_tokens
};

struct RandomOptions {
  int64_t input_len = 1024, output_len = 128, prefix_len = 0;
  double range_ratio = 0.0;  // lengths uniform in [len * (1 - r), len * (1 + r)]
};

struct PrefixRepetitionOptions {
  int64_t prefix_len = 256, suffix_len = 256, num_prefixes = 10, output_len = 128;
};

inline constexpr int64_t kShareGptDefaultOutputLen = 128;

struct ShareGptOptions {
  std::string path;
  int64_t output_len = -1;  // < 0: the length of the dataset's reply (tokenised)
};

// Token ids that are safe to sample for random prompts: ordinary BPE ranks whose bytes are valid
// UTF-8 on their own and round-trip (decode -> encode gives the same single id), so the text form
// of a random prompt has the same length as its id form.
std::vector<int32_t> sampleable_ids(const text::Tokenizer& tok);

// `pool` empty: ids 0 .. vocab-1 (used by tests without a tokenizer).
std::vector<BenchRequest> random_dataset(int64_t n, const RandomOptions& o, const std::vector<int32_t>& pool,
                                         uint64_t seed);
std::vector<BenchRequest> prefix_repetition_dataset(int64_t n, const PrefixRepetitionOptions& o,
                                                    const std::vector<int32_t>& pool, uint64_t seed);
// First turn -> prompt; output length: o.output_len if >= 0, else the next turn's token count, else
// (prompt-only files) kShareGptDefaultOutputLen. vllm's filter with reference replies (prompt or
// reply < 4 tokens, prompt > 1024 or prompt + reply > 2048 skipped), otherwise prompts of < 4 or
// > 1024 tokens skipped. Shuffled with the seed, first n taken.
std::vector<BenchRequest> sharegpt_dataset(int64_t n, const ShareGptOptions& o, const text::Tokenizer& tok,
                                           uint64_t seed);

// Fills prompt_text from prompt_ids (for the chat endpoint, which takes text).
void decode_prompts(std::vector<BenchRequest>& reqs, const text::Tokenizer& tok);

}  // namespace k3::bench
