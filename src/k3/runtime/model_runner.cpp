#include "k3/runtime/model_runner.h"

#include <algorithm>

#include "k3/core/error.h"
#include "k3/core/thread_pool.h"

namespace k3 {

void check_batch_tokens(const BatchItem& item, int64_t vocab) {
  if (item.tokens.empty()) throw Error("forward: a sequence with no tokens");
  if (item.want_logits && (item.n_logit_rows < 1 || item.n_logit_rows > static_cast<int64_t>(item.tokens.size())))
    throw Error("forward: " + std::to_string(item.n_logit_rows) + " logits rows asked of a sequence of " +
                std::to_string(item.tokens.size()) + " new tokens");
  for (int32_t t : item.tokens)
    if (t < 0 || t >= vocab)
      throw Error("token id " + std::to_string(t) + " out of range [0, " + std::to_string(vocab) + ")");
}

int64_t logit_rows_of(const BatchItem& item, const ForwardOptions& opt) {
  if (!item.want_logits) return 0;
  return opt.all_logits ? static_cast<int64_t>(item.tokens.size()) : item.n_logit_rows;
}

void check_tap_layers(const ForwardOptions& opt, int64_t num_layers) {
  if (opt.tap_layers.empty()) return;
  if (!opt.taps) throw Error("forward: tap layers were asked for without a place for the taps (ForwardOptions::taps)");
  for (const int32_t l : opt.tap_layers)
    if (l < 0 || l > num_layers)
      throw Error("forward: tap id " + std::to_string(l) + " out of range [0, " + std::to_string(num_layers) +
                  "] (layer l's normed mixer input, or " + std::to_string(num_layers) + ": the final-normed hidden state)");
}

void taps_to_rows(const float* tap_major, int64_t T, int64_t R, int64_t H, std::vector<float>& out) {
  out.resize(static_cast<size_t>(R * T * H));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const float* src = tap_major + (t * R + r) * H;
      std::copy(src, src + H, out.data() + (r * T + t) * H);
    }
}

void check_forward_sample_args(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                               const ForwardOptions& opt) {
  if (opt.all_logits) throw Error("forward_sample: all_logits is not supported");
  size_t wanted = 0;
  for (const BatchItem& it : items) wanted += static_cast<size_t>(logit_rows_of(it, opt));
  if (wanted != rows.size())
    throw Error("forward_sample: " + std::to_string(rows.size()) + " sampling rows for " + std::to_string(wanted) +
                " logits rows");
}

void ModelRunner::forward_sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                                 std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits,
                                 const ForwardOptions& opt) const {
  check_forward_sample_args(items, rows, opt);
  // Reused across steps by the calling thread: a fresh [rows][V] vector each step (650 KB a row at
  // V = 163840) is a fresh mapping to fault in. Named by reference: the pool's workers below must read THIS
  // thread's buffer (a thread_local named inside the lambda would be each worker's own, empty one).
  thread_local std::vector<float> reused;
  std::vector<float>& logits = reused;
  forward_batch(items, logits, opt);
  const size_t V = static_cast<size_t>(config().vocab_size);
  results.resize(rows.size());
  raw_logits.clear();
  for (size_t j = 0; j < rows.size(); ++j)  // before sampling rewrites the rows
    if (rows[j].raw_logits) raw_logits.insert(raw_logits.end(), logits.begin() + j * V, logits.begin() + (j + 1) * V);
  // Rows are independent: one per pool task (a row's result does not depend on the thread).
  parallel_for(static_cast<int64_t>(rows.size()), rows.size() > 1, [&](int64_t j) {
    const std::span<float> row(logits.data() + j * V, V);
    results[static_cast<size_t>(j)] = sampling::sample_row(row, rows[static_cast<size_t>(j)].sampling);
  });
}

}  // namespace k3
