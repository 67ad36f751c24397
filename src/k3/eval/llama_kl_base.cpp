#include "k3/eval/llama_kl_base.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "k3/core/error.h"
#include "k3/io/mapped_file.h"

namespace k3::eval {

namespace {
constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr size_t kHeaderBytes = 20;  // magic, n_ctx, n_vocab, n_chunk
constexpr int64_t kMaxVocab = int64_t{1} << 24, kMaxCtx = int64_t{1} << 20, kMaxTokens = int64_t{1} << 31;

int64_t read_i32(const uint8_t* p, bool is_unsigned) {
  if (is_unsigned) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace

bool is_llama_kl_base(const uint8_t* data, size_t size) { return size >= 8 && std::memcmp(data, kMagic, 8) == 0; }

LlamaKlBaseHeader parse_llama_kl_base(const uint8_t* data, size_t size) {
  if (size < kHeaderBytes || !is_llama_kl_base(data, size)) throw Error("not a llama.cpp KL-divergence base file (no _logits_ header)");
  LlamaKlBaseHeader h;
  h.n_ctx = read_i32(data + 8, true);
  h.n_vocab = read_i32(data + 12, false);
  h.n_chunk = read_i32(data + 16, false);
  if (h.n_ctx < 4 || h.n_ctx > kMaxCtx) throw Error("llama.cpp KL base file: n_ctx " + std::to_string(h.n_ctx) + " out of range 4..2^20");
  if (h.n_vocab < 2 || h.n_vocab > kMaxVocab)
    throw Error("llama.cpp KL base file: vocabulary size " + std::to_string(h.n_vocab) + " out of range 2..2^24");
  if (h.n_chunk < 1 || h.n_chunk * h.n_ctx > kMaxTokens)
    throw Error("llama.cpp KL base file: " + std::to_string(h.n_chunk) + " chunks of " + std::to_string(h.n_ctx) + " tokens out of range");
  h.tokens_offset = kHeaderBytes;
  h.rows_offset = kHeaderBytes + 4 * static_cast<size_t>(h.n_chunk * h.n_ctx);
  // Bounded: 2^31 tokens x (2^24 + 4) x 2 bytes < 2^63.
  const uint64_t want = h.rows_offset + static_cast<uint64_t>(h.n_chunk) * static_cast<uint64_t>(h.rows_per_chunk()) *
                                            static_cast<uint64_t>(h.row_u16()) * 2;
  if (static_cast<uint64_t>(size) != want)
    throw Error("llama.cpp KL base file: " + std::to_string(size) + " bytes, the header implies " + std::to_string(want) +
                " (truncated or another format)");
  for (int64_t i = 0; i < h.n_chunk * h.n_ctx; ++i) {
    const int64_t id = read_i32(data + h.tokens_offset + 4 * static_cast<size_t>(i), false);
    if (id < 0 || id >= h.n_vocab)
      throw Error("llama.cpp KL base file: token " + std::to_string(i) + " has id " + std::to_string(id) + ", outside the vocabulary");
  }
  return h;
}

struct LlamaKlBase::Impl {
  MappedFile file;
  explicit Impl(const std::string& path) : file(path) {}
};

LlamaKlBase::LlamaKlBase(const std::string& path) : impl_(std::make_unique<Impl>(path)) {
  try {
    h_ = parse_llama_kl_base(impl_->file.data(), impl_->file.size());
  } catch (const Error& e) {
    throw Error("'" + path + "': " + e.what());
  }
}
LlamaKlBase::~LlamaKlBase() = default;

std::span<const int32_t> LlamaKlBase::tokens() const {
  return {reinterpret_cast<const int32_t*>(impl_->file.data() + h_.tokens_offset), static_cast<size_t>(h_.n_chunk * h_.n_ctx)};
}

void LlamaKlBase::decode_row(int64_t c, int64_t r, float* logp) const {
  if (c < 0 || c >= h_.n_chunk || r < 0 || r >= h_.rows_per_chunk())
    throw Error("llama.cpp KL base file: row " + std::to_string(r) + " of chunk " + std::to_string(c) + " out of range");
  const uint8_t* row = impl_->file.data() + h_.rows_offset +
                       static_cast<size_t>((c * h_.rows_per_chunk() + r) * h_.row_u16()) * 2;
  float scale, min_log_prob;
  std::memcpy(&scale, row, 4);
  std::memcpy(&min_log_prob, row + 4, 4);
  if (!std::isfinite(scale) || !std::isfinite(min_log_prob) || scale < 0)
    throw Error("llama.cpp KL base file: chunk " + std::to_string(c) + " row " + std::to_string(r) + " has a bad scale");
  for (int64_t v = 0; v < h_.n_vocab; ++v) {
    uint16_t q;
    std::memcpy(&q, row + 8 + 2 * static_cast<size_t>(v), 2);
    logp[v] = scale * static_cast<float>(q) + min_log_prob;
  }
}

void encode_llama_row(const float* logp, int64_t n_vocab, uint16_t* out) {
  // As llama.cpp: the range is [max - 16, max] of the log-probs (log-probs differ from logits by a
  // constant), 65535 steps, values at or below the floor stored as 0.
  float mx = logp[0], mn = logp[0];
  for (int64_t i = 1; i < n_vocab; ++i) {
    mx = std::max(mx, logp[i]);
    mn = std::min(mn, logp[i]);
  }
  mn = std::max(mn, mx - 16.0f);
  const float scale = (mx - mn) / 65535.0f;
  std::memcpy(out, &scale, 4);
  std::memcpy(out + 2, &mn, 4);
  uint16_t* q = out + 4;
  const int64_t n_pad = 2 * ((n_vocab + 1) / 2);
  std::fill(q, q + n_pad, uint16_t{0});
  if (scale > 0) {
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < n_vocab; ++i)
      if (logp[i] > mn) q[i] = static_cast<uint16_t>(std::min(65535.0f, std::nearbyint(inv * (logp[i] - mn))));
  }
}

LlamaKlBaseWriter::LlamaKlBaseWriter(const std::string& path, int64_t n_ctx, int64_t n_vocab, std::span<const int32_t> tokens)
    : path_(path) {
  h_.n_ctx = n_ctx;
  h_.n_vocab = n_vocab;
  h_.n_chunk = n_ctx > 0 ? static_cast<int64_t>(tokens.size()) / n_ctx : 0;
  if (n_ctx < 4 || n_ctx > kMaxCtx || n_vocab < 2 || n_vocab > kMaxVocab || h_.n_chunk < 1 ||
      static_cast<int64_t>(tokens.size()) != h_.n_chunk * n_ctx || h_.n_chunk * n_ctx > kMaxTokens)
    throw Error("llama.cpp KL base file: sizes out of range (ctx " + std::to_string(n_ctx) + ", vocab " +
                std::to_string(n_vocab) + ", tokens " + std::to_string(tokens.size()) + ": whole chunks of ctx >= 4)");
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error("cannot write '" + path + "'");
  const uint32_t ctx32 = static_cast<uint32_t>(n_ctx);
  const int32_t v32 = static_cast<int32_t>(n_vocab), c32 = static_cast<int32_t>(h_.n_chunk);
  const bool ok = std::fwrite(kMagic, 1, 8, f_) == 8 && std::fwrite(&ctx32, 4, 1, f_) == 1 && std::fwrite(&v32, 4, 1, f_) == 1 &&
                  std::fwrite(&c32, 4, 1, f_) == 1 && std::fwrite(tokens.data(), 4, tokens.size(), f_) == tokens.size();
  if (!ok) {
    std::fclose(f_);
    f_ = nullptr;
    throw Error("cannot write '" + path + "' (disk full?)");
  }
  buf_.resize(static_cast<size_t>(h_.row_u16()));
}

LlamaKlBaseWriter::~LlamaKlBaseWriter() {
  if (f_) std::fclose(f_);
}

void LlamaKlBaseWriter::add_row(const float* logp) {
  if (!f_ || rows_ >= h_.n_chunk * h_.rows_per_chunk()) throw Error("llama.cpp KL base file '" + path_ + "': more rows than chunks hold");
  encode_llama_row(logp, h_.n_vocab, buf_.data());
  if (std::fwrite(buf_.data(), 2, buf_.size(), f_) != buf_.size()) throw Error("cannot write '" + path_ + "' (disk full?)");
  ++rows_;
}

void LlamaKlBaseWriter::finish() {
  const int64_t want = h_.n_chunk * h_.rows_per_chunk();
  if (rows_ != want)
    throw Error("llama.cpp KL base file '" + path_ + "': " + std::to_string(rows_) + " rows written, " + std::to_string(want) + " expected");
  const bool ok = f_ && std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) throw Error("cannot write '" + path_ + "' (disk full?)");
}

}  // namespace k3::eval
