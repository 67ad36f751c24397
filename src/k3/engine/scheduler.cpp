#include "k3/engine/scheduler.h"

#include <algorithm>

namespace k3::engine {

int64_t Scheduler::chunk_for(Sequence& s, int64_t budget) const {
  const int64_t past = s.cache().n_past(), total = static_cast<int64_t>(s.tokens().size());
  int64_t n = std::min(s.remaining(), budget);
  if (cache_.prefix_caching() && n > 1 && opt_.checkpoint_interval > 0) {
    // Stop at the next checkpoint position inside the prompt so its state can be saved there.
    const int64_t next = (past / opt_.checkpoint_interval + 1) * opt_.checkpoint_interval;
    if (next < total && past + n > next) n = next - past;
  }
  return n;
}

bool Scheduler::preempt_newest(const Sequence* keep) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (it->get() == keep) continue;
    std::unique_ptr<Sequence> s = std::move(*it);
    running_.erase(std::next(it).base());
    cache_.release(s->cache());
    waiting_.push_front(std::move(s));
    ++preemptions_;
    return true;
  }
  return false;
}

std::vector<ScheduledSeq> Scheduler::schedule() {
  std::vector<ScheduledSeq> out;
  int64_t budget = opt_.max_num_batched_tokens;
  // 1. Running sequences, oldest first. Index loop: preemption removes from the back.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    const int64_t n = chunk_for(s, budget);
    bool ok = cache_.ensure_capacity(s.cache(), s.cache().n_past() + n);
    while (!ok && preempt_newest(&s)) ok = cache_.ensure_capacity(s.cache(), s.cache().n_past() + n);
    if (!ok) {  // even alone it does not fit now: recompute it later
      std::unique_ptr<Sequence> self = std::move(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      cache_.release(self->cache());
      waiting_.push_front(std::move(self));
      ++preemptions_;
      --i;
      continue;
    }
    out.push_back({&s, n, n == s.remaining()});
    budget -= n;
  }
  // 2. Admissions, first come first served.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < opt_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    if (!cache_.acquire_slot(s.cache())) break;
    const int64_t hit = cache_.match_prefix(s.cache(), s.tokens());
    if (hit > 0) s.set_cached_prompt_tokens(std::min(hit, s.prompt_len()));
    const int64_t n = chunk_for(s, budget);
    if (!cache_.ensure_capacity(s.cache(), s.cache().n_past() + n)) {
      cache_.release(s.cache());
      break;  // wait until memory frees up
    }
    s.admitted_order = ++admitted_;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    out.push_back({&s, n, n == s.remaining()});
    budget -= n;
  }
  return out;
}

std::unique_ptr<Sequence> Scheduler::remove(Sequence* s) {
  std::unique_ptr<Sequence> r;
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == s) {
      r = std::move(*it);
      running_.erase(it);
      break;
    }
  if (!r)
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
      if (it->get() == s) {
        r = std::move(*it);
        waiting_.erase(it);
        break;
      }
  if (r) cache_.release(r->cache());
  return r;
}

Sequence* Scheduler::find(const std::string& id) {
  for (auto& s : running_)
    if (s->request().id == id) return s.get();
  for (auto& s : waiting_)
    if (s->request().id == id) return s.get();
  return nullptr;
}

std::vector<Sequence*> Scheduler::all() {
  std::vector<Sequence*> v;
  for (auto& s : running_) v.push_back(s.get());
  for (auto& s : waiting_) v.push_back(s.get());
  return v;
}

}  // namespace k3::engine
