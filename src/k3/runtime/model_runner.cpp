#include "k3/runtime/model_runner.h"

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
