// llama.cpp's KL-divergence base file (`llama-perplexity --kl-divergence-base FILE` without
// --kl-divergence writes it), read and written by k3 so that either tool's base judges either tool's
// model: the way to compare k3's logits with llama.cpp's on the same GGUF, and k3's quantisations with
// llama.cpp's against one base. Format facts (learned from llama.cpp's tools/perplexity, little-endian):
//   char[8]  "_logits_"
//   uint32   n_ctx                      window (chunk) length in tokens
//   int32    n_vocab
//   int32    n_chunk
//   int32    tokens[n_chunk * n_ctx]    the text's tokens (the first of each chunk is replaced by BOS when run)
//   then per chunk, rows for positions n_ctx/2 .. n_ctx-2 (each predicting the next token):
//     nv = 2 * ((n_vocab + 1) / 2) + 4 uint16 per row: float32 scale, float32 min_log_prob (the first 4
//     uint16), then n_vocab uint16 q: log p = scale * q + min_log_prob (q = 0 for anything at or below
//     max_log_prob - 16), zero-padded to an even count.
// The scoring rule that goes with it (llama-perplexity's): chunk c runs tokens[c*n_ctx .. +n_ctx) with its
// first token replaced by BOS from an empty state, and only the second half is scored.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace k3::eval {

// llama-perplexity leaves base log-probs at or below this out of its KL sum (KlAccumulator's base_floor).
inline constexpr float kLlamaKlFloor = -16.0f;

struct LlamaKlBaseHeader {
  int64_t n_ctx = 0, n_vocab = 0, n_chunk = 0;
  size_t tokens_offset = 0, rows_offset = 0;
  int64_t first() const { return n_ctx / 2; }                    // the first scored position of a chunk
  int64_t rows_per_chunk() const { return n_ctx - 1 - n_ctx / 2; }
  int64_t row_u16() const { return 2 * ((n_vocab + 1) / 2) + 4; }
};

// Whether a file image starts with llama.cpp's base magic.
bool is_llama_kl_base(const uint8_t* data, size_t size);
// Validates a whole image (header ranges, exact size, token ids); throws k3::Error naming what is wrong.
LlamaKlBaseHeader parse_llama_kl_base(const uint8_t* data, size_t size);

// A llama.cpp base file opened read-only (mapped).
class LlamaKlBase {
 public:
  explicit LlamaKlBase(const std::string& path);  // throws k3::Error
  ~LlamaKlBase();
  const LlamaKlBaseHeader& header() const { return h_; }
  std::span<const int32_t> tokens() const;
  // Row r (0 .. rows_per_chunk-1) of chunk c decoded to n_vocab natural-log probabilities.
  void decode_row(int64_t c, int64_t r, float* logp) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LlamaKlBaseHeader h_;
};

// Encodes one row of log-probabilities as llama.cpp does (into row_u16() uint16).
void encode_llama_row(const float* logp, int64_t n_vocab, uint16_t* out);

// Writes a llama.cpp base file as rows come: chunks in order, rows_per_chunk rows each.
class LlamaKlBaseWriter {
 public:
  LlamaKlBaseWriter(const std::string& path, int64_t n_ctx, int64_t n_vocab, std::span<const int32_t> tokens);
  ~LlamaKlBaseWriter();
  void add_row(const float* logp);
  void finish();  // throws unless every chunk's rows were added

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  LlamaKlBaseHeader h_;
  int64_t rows_ = 0;
  std::vector<uint16_t> buf_;
};

}  // namespace k3::eval
