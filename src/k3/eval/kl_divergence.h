// Quality of a model against a base model on the same text, the way llama.cpp's `llama-perplexity
// --kl-divergence` measures quantisations: the base run saves every scored position's log-probabilities
// (a base file), a later run of another model (a quantised one, another CPU tier, another backend) reads
// them and reports the perplexity ratio and the KL divergence of its next-token distributions from the
// base's, their median and tails, how often the top-1 token is the same, and the RMS change in the
// probability of the actual next token.
//
// Base file, version 1 (little-endian; written by KlBaseWriter, validated by parse_kl_base):
//   0  char[8]  "K3KLDB01"
//   8  uint64   n_vocab       (2 .. 2^24)
//   16 uint64   ctx           (window length in tokens, 2 .. 2^20)
//   24 uint64   n_ids         (text tokens the windows cover, 1 .. 2^31)
//   32 uint64   n_rows        (scored positions, n_ids exactly: every text token is scored once)
//   40 int32    ids[n_ids]    (each in 0 .. n_vocab-1), then zero padding to a multiple of 8
//   .. float32  logp[n_rows][n_vocab]   (natural-log softmax of the base logits, row per scored position)
// Stored as fp32 so that a model compared with itself gives KLD 0 exactly; the size is 4 x rows x vocab
// (400 tokens of a 163,840-token vocabulary: 262 MB).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace k3::eval {

struct KlBaseHeader {
  int64_t n_vocab = 0, ctx = 0, n_ids = 0, n_rows = 0;
  size_t ids_offset = 0, rows_offset = 0;  // byte offsets in the file
};

// Validates a whole base file image (header, ids, exact size); throws k3::Error naming what is wrong.
KlBaseHeader parse_kl_base(const uint8_t* data, size_t size);

// A base file opened read-only (mapped): ids and rows as views.
class KlBase {
 public:
  explicit KlBase(const std::string& path);  // throws k3::Error
  ~KlBase();
  const KlBaseHeader& header() const { return h_; }
  std::span<const int32_t> ids() const;
  const float* row(int64_t i) const;  // n_vocab log-probs of scored position i

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  KlBaseHeader h_;
};

// Writes a base file as the rows come (bounded memory); the header's row count is checked at finish().
class KlBaseWriter {
 public:
  KlBaseWriter(const std::string& path, int64_t n_vocab, int64_t ctx, std::span<const int32_t> ids);
  ~KlBaseWriter();
  void add_row(const float* logp);  // one scored position's log-probs (log_softmax of its logits)
  void finish();                      // throws unless exactly n_ids rows were added

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  int64_t n_vocab_, n_ids_, rows_ = 0;
};

// log-softmax of `logits` (double accumulation) into out[V].
void log_softmax(const float* logits, int64_t V, float* out);

struct KlSummary {
  int64_t n = 0;
  double ppl_base = 0, ppl = 0;                  // perplexities of the base and of this model
  double kld_mean = 0, kld_stderr = 0;           // KL(base || this), nats per position
  double kld_median = 0, kld_p90 = 0, kld_p99 = 0, kld_p999 = 0, kld_max = 0;
  double same_top1 = 0;                          // fraction of positions with the same argmax
  double rms_dp = 0;                             // RMS of p(next token) - p_base(next token)
};

// Accumulates positions: the base's log-probs, this model's log-probs (log_softmax), the actual next token.
class KlAccumulator {
 public:
  // `base_floor`: base log-probs at or below it are left out of the KL sum (llama.cpp's rule for its 16-bit
  // base rows, which store every log-prob more than 16 below the row's maximum as that floor: -16).
  void add(const float* base_logp, const float* logp, int64_t V, int32_t next,
           float base_floor = -std::numeric_limits<float>::infinity());
  KlSummary summary() const;  // throws k3::Error when nothing was added

 private:
  std::vector<double> kld_;
  double nll_base_ = 0, nll_ = 0, dp2_ = 0;
  int64_t same_top1_ = 0;
};

}  // namespace k3::eval
