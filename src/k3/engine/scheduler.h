// Continuous batching policy: which sequences run this step and how many tokens each. Each step's token
// budget (max_num_batched_tokens) goes first to the running decodes, one token each (oldest first), so a
// long prefill never stalls them; the rest is shared between the prefilling sequences -- running ones
// and newly admitted ones (FCFS, while max_num_seqs and the cache allow) -- by water-filling: short
// prompts take what they need, the others equal shares. A 16-token request arriving behind a 20k-token
// prefill thus runs its prompt in the next step instead of after the whole prefill. Prefill chunks end
// at prefix-checkpoint positions so the KDA state can be saved exactly there. When the cache runs out,
// the most recently admitted sequence without a chunk this step is preempted (its cache freed,
// recomputed later). The scheduler never touches the model.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "k3/cache/hybrid_cache.h"
#include "k3/engine/sequence.h"

namespace k3::engine {

struct SchedulerOptions {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  // Tokens between KDA state checkpoints inside a prompt (prefix caching); 0: HybridCache's
  // auto_checkpoint_interval() (a checkpoint costs about what the latent pages it spans cost).
  int64_t checkpoint_interval = 0;
  // Speculative decoding's k (0: off). A decoding sequence then runs its pending tokens (1, or after a
  // "replay" rollback the kept tokens not yet in the cache: at most k) plus its drafts as one chunk, all of
  // them counted against max_num_batched_tokens (drafts are cut to fit).
  int64_t num_speculative_tokens = 0;
};

struct ScheduledSeq {
  Sequence* seq;
  int64_t n_tokens;
  bool sample;  // this chunk completes the sequence's pending tokens: sample the next one
  int64_t n_drafts = 0;  // the last n_drafts of the n_tokens are the sequence's drafts (to verify)
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& opt, cache::HybridCache& cache) : opt_(opt), cache_(cache) {}

  void add(std::unique_ptr<Sequence> s) { waiting_.push_back(std::move(s)); }
  std::vector<ScheduledSeq> schedule();
  // Removes a sequence (finished or aborted) and frees its cache. Returns ownership.
  std::unique_ptr<Sequence> remove(Sequence* s);
  Sequence* find(const std::string& request_id);
  std::vector<Sequence*> all();

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t preemptions() const { return preemptions_; }
  bool idle() const { return running_.empty() && waiting_.empty(); }

 private:
  int64_t chunk_for(Sequence& s, int64_t budget) const;
  bool is_running(const Sequence* s) const;
  // Frees the sequence's cache and puts it at the front of the queue; `count`: a preemption (not an
  // admission taken back in the step that made it).
  void requeue(Sequence* s, bool count);
  // Preempts the newest running sequence other than `keep` that has no chunk in `planned` yet.
  bool preempt_newest(const Sequence* keep, const std::vector<ScheduledSeq>& planned, int64_t first_fresh);
  // Pages for n more tokens of s, preempting as needed. False: even alone it does not fit now.
  bool reserve(Sequence& s, int64_t n, const std::vector<ScheduledSeq>& planned, int64_t first_fresh);
  void schedule_decodes(std::vector<ScheduledSeq>& out, int64_t& budget);
  std::vector<Sequence*> admit_prefills(int64_t budget, const std::vector<ScheduledSeq>& planned);

  SchedulerOptions opt_;
  cache::HybridCache& cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  int64_t admitted_ = 0, preemptions_ = 0;
};

}  // namespace k3::engine
