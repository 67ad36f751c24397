#include "k3/eval/kl_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "k3/core/error.h"
#include "k3/io/mapped_file.h"

namespace k3::eval {

namespace {
constexpr char kMagic[8] = {'K', '3', 'K', 'L', 'D', 'B', '0', '1'};
constexpr size_t kHeaderBytes = 40;
constexpr int64_t kMaxVocab = int64_t{1} << 24, kMaxCtx = int64_t{1} << 20, kMaxIds = int64_t{1} << 31;

uint64_t read_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
size_t padded8(size_t n) { return (n + 7) / 8 * 8; }

// Nearest-rank quantile of sorted values.
double quantile(const std::vector<double>& sorted, double q) {
  const size_t n = sorted.size();
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
  i = std::clamp<size_t>(i, 1, n);
  return sorted[i - 1];
}
}  // namespace

KlBaseHeader parse_kl_base(const uint8_t* data, size_t size) {
  if (size < kHeaderBytes || std::memcmp(data, kMagic, 8) != 0)
    throw Error("not a k3 KL-divergence base file (no K3KLDB01 header; make one with k3 perplexity --kl-divergence-base FILE)");
  KlBaseHeader h;
  const uint64_t v = read_u64(data + 8), c = read_u64(data + 16), ni = read_u64(data + 24), nr = read_u64(data + 32);
  if (v < 2 || v > static_cast<uint64_t>(kMaxVocab)) throw Error("KL base file: vocabulary size " + std::to_string(v) + " out of range 2..2^24");
  if (c < 2 || c > static_cast<uint64_t>(kMaxCtx)) throw Error("KL base file: window length " + std::to_string(c) + " out of range 2..2^20");
  if (ni < 1 || ni > static_cast<uint64_t>(kMaxIds)) throw Error("KL base file: token count " + std::to_string(ni) + " out of range 1..2^31");
  if (nr != ni) throw Error("KL base file: " + std::to_string(nr) + " rows for " + std::to_string(ni) + " tokens (every token is scored once)");
  h.n_vocab = static_cast<int64_t>(v);
  h.ctx = static_cast<int64_t>(c);
  h.n_ids = static_cast<int64_t>(ni);
  h.n_rows = static_cast<int64_t>(nr);
  h.ids_offset = kHeaderBytes;
  h.rows_offset = padded8(kHeaderBytes + 4 * static_cast<size_t>(ni));
  // Bounded above (2^31 x 2^24 x 4 < 2^63), so no overflow.
  const uint64_t want = h.rows_offset + static_cast<uint64_t>(nr) * v * 4;
  if (static_cast<uint64_t>(size) != want)
    throw Error("KL base file: " + std::to_string(size) + " bytes, the header implies " + std::to_string(want) +
                " (truncated or not from this tool)");
  for (int64_t i = 0; i < h.n_ids; ++i) {
    int32_t id;
    std::memcpy(&id, data + h.ids_offset + 4 * static_cast<size_t>(i), 4);
    if (id < 0 || id >= h.n_vocab) throw Error("KL base file: token " + std::to_string(i) + " has id " + std::to_string(id) + ", outside the vocabulary");
  }
  return h;
}

struct KlBase::Impl {
  MappedFile file;
  explicit Impl(const std::string& path) : file(path) {}
};

KlBase::KlBase(const std::string& path) : impl_(std::make_unique<Impl>(path)) {
  try {
    h_ = parse_kl_base(impl_->file.data(), impl_->file.size());
  } catch (const Error& e) {
    throw Error("'" + path + "': " + e.what());
  }
}
KlBase::~KlBase() = default;

std::span<const int32_t> KlBase::ids() const {
  return {reinterpret_cast<const int32_t*>(impl_->file.data() + h_.ids_offset), static_cast<size_t>(h_.n_ids)};
}

const float* KlBase::row(int64_t i) const {
  if (i < 0 || i >= h_.n_rows) throw Error("KL base file: row " + std::to_string(i) + " out of range");
  return reinterpret_cast<const float*>(impl_->file.data() + h_.rows_offset) + i * h_.n_vocab;
}

KlBaseWriter::KlBaseWriter(const std::string& path, int64_t n_vocab, int64_t ctx, std::span<const int32_t> ids)
    : path_(path), n_vocab_(n_vocab), n_ids_(static_cast<int64_t>(ids.size())) {
  if (n_vocab < 2 || n_vocab > kMaxVocab || ctx < 2 || ctx > kMaxCtx || ids.empty() || n_ids_ > kMaxIds)
    throw Error("KL base file: sizes out of range (vocab " + std::to_string(n_vocab) + ", ctx " + std::to_string(ctx) +
                ", tokens " + std::to_string(ids.size()) + ")");
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error("cannot write '" + path + "'");
  uint64_t head[4] = {static_cast<uint64_t>(n_vocab), static_cast<uint64_t>(ctx), ids.size(), ids.size()};
  const size_t pad = padded8(kHeaderBytes + 4 * ids.size()) - (kHeaderBytes + 4 * ids.size());
  const uint8_t zeros[8] = {};
  bool ok = std::fwrite(kMagic, 1, 8, f_) == 8 && std::fwrite(head, 8, 4, f_) == 4 &&
            std::fwrite(ids.data(), 4, ids.size(), f_) == ids.size() && std::fwrite(zeros, 1, pad, f_) == pad;
  if (!ok) {
    std::fclose(f_);
    f_ = nullptr;
    throw Error("cannot write '" + path + "' (disk full?)");
  }
}

KlBaseWriter::~KlBaseWriter() {
  if (f_) std::fclose(f_);
}

void KlBaseWriter::add_row(const float* logp) {
  if (!f_ || rows_ >= n_ids_) throw Error("KL base file '" + path_ + "': more rows than tokens");
  const size_t n = static_cast<size_t>(n_vocab_);
  if (std::fwrite(logp, 4, n, f_) != n) throw Error("cannot write '" + path_ + "' (disk full?)");
  ++rows_;
}

void KlBaseWriter::finish() {
  if (rows_ != n_ids_)
    throw Error("KL base file '" + path_ + "': " + std::to_string(rows_) + " rows written for " + std::to_string(n_ids_) + " tokens");
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) throw Error("cannot write '" + path_ + "' (disk full?)");
}

void log_softmax(const float* logits, int64_t V, float* out) {
  float mx = logits[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, logits[v]);
  double se = 0;
  for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(logits[v]) - mx);
  const double lse = std::log(se) + mx;
  for (int64_t v = 0; v < V; ++v) out[v] = static_cast<float>(static_cast<double>(logits[v]) - lse);
}

void KlAccumulator::add(const float* base_logp, const float* logp, int64_t V, int32_t next, float base_floor) {
  if (next < 0 || next >= V) throw Error("KL divergence: next token " + std::to_string(next) + " outside the vocabulary");
  double kld = 0;
  int64_t top_b = 0, top = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double lb = base_logp[v], l = logp[v];
    if (base_logp[v] > base_floor) kld += std::exp(lb) * (lb - l);
    if (base_logp[v] > base_logp[top_b]) top_b = v;
    if (logp[v] > logp[top]) top = v;
  }
  kld_.push_back(kld);
  nll_base_ -= base_logp[next];
  nll_ -= logp[next];
  const double dp = std::exp(static_cast<double>(logp[next])) - std::exp(static_cast<double>(base_logp[next]));
  dp2_ += dp * dp;
  same_top1_ += top_b == top;
}

KlSummary KlAccumulator::summary() const {
  if (kld_.empty()) throw Error("KL divergence: no positions scored");
  KlSummary s;
  s.n = static_cast<int64_t>(kld_.size());
  const double n = static_cast<double>(s.n);
  s.ppl_base = std::exp(nll_base_ / n);
  s.ppl = std::exp(nll_ / n);
  double sum = 0, sum2 = 0;
  for (double k : kld_) sum += k, sum2 += k * k;
  s.kld_mean = sum / n;
  s.kld_stderr = s.n > 1 ? std::sqrt(std::max(0.0, (sum2 / n - s.kld_mean * s.kld_mean) / (n - 1))) : 0.0;
  std::vector<double> sorted = kld_;
  std::sort(sorted.begin(), sorted.end());
  s.kld_median = quantile(sorted, 0.5);
  s.kld_p90 = quantile(sorted, 0.9);
  s.kld_p99 = quantile(sorted, 0.99);
  s.kld_p999 = quantile(sorted, 0.999);
  s.kld_max = sorted.back();
  s.same_top1 = static_cast<double>(same_top1_) / n;
  s.rms_dp = std::sqrt(dp2_ / n);
  return s;
}

}  // namespace k3::eval
