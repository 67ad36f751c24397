#include "k3/engine/scheduler.h"

#include <algorithm>
#include <numeric>

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

bool Scheduler::is_running(const Sequence* s) const {
  return std::any_of(running_.begin(), running_.end(), [s](const auto& r) { return r.get() == s; });
}

void Scheduler::requeue(Sequence* s, bool count) {
  auto it = std::find_if(running_.begin(), running_.end(), [s](const auto& r) { return r.get() == s; });
  std::unique_ptr<Sequence> owned = std::move(*it);
  running_.erase(it);
  cache_.release(owned->cache());
  waiting_.push_front(std::move(owned));
  if (count) ++preemptions_;
}

bool Scheduler::preempt_newest(const Sequence* keep, const std::vector<ScheduledSeq>& planned, int64_t first_fresh) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* c = it->get();
    if (c == keep || std::any_of(planned.begin(), planned.end(), [c](const ScheduledSeq& p) { return p.seq == c; }))
      continue;
    requeue(c, c->admitted_order < first_fresh);
    return true;
  }
  return false;
}

bool Scheduler::reserve(Sequence& s, int64_t n, const std::vector<ScheduledSeq>& planned, int64_t first_fresh) {
  const int64_t need = s.cache().n_past() + n;
  while (!cache_.ensure_capacity(s.cache(), need))
    if (!preempt_newest(&s, planned, first_fresh)) return false;
  return true;
}

// 1. One token for every running sequence that is decoding, oldest first; with speculation, its
// pending tokens and as many of its drafts as the budget takes.
void Scheduler::schedule_decodes(std::vector<ScheduledSeq>& out, int64_t& budget) {
  std::vector<Sequence*> order;
  for (auto& r : running_) order.push_back(r.get());
  const int64_t k = opt_.num_speculative_tokens;
  auto decoding = [k](Sequence& s) {
    const int64_t pending = s.remaining();
    return pending == 1 || (k > 0 && s.decoding() && pending >= 1 && pending <= k + 1);
  };
  // Drafts take only what is left once every decode's pending tokens are counted: speculation never
  // pushes a decode out of its step.
  std::vector<int64_t> decode_pending(order.size(), 0);  // 0: not decoding (prefilling)
  int64_t pending_after = 0;  // pending tokens of the decodes not handled yet
  for (size_t i = 0; i < order.size(); ++i)
    if (decoding(*order[i])) pending_after += decode_pending[i] = order[i]->remaining();
  for (size_t i = 0; i < order.size(); ++i) {
    Sequence* s = order[i];
    pending_after -= decode_pending[i];
    if (budget == 0) break;
    if (!is_running(s)) continue;  // preempted meanwhile
    const int64_t pending = decode_pending[i];
    if (pending == 0 || pending > budget) {  // prefilling: step 2
      s->drafts().clear();
      continue;
    }
    const int64_t spare = std::max<int64_t>(0, budget - pending - pending_after);
    const int64_t drafts = std::min<int64_t>(static_cast<int64_t>(s->drafts().size()), spare);
    s->drafts().resize(static_cast<size_t>(drafts));
    if (!reserve(*s, pending + drafts, out, admitted_ + 1)) {
      s->drafts().clear();
      requeue(s, true);  // even alone it does not fit now: recompute it later
      continue;
    }
    out.push_back({s, pending + drafts, true, drafts});
    budget -= pending + drafts;
  }
}

// 2. The sequences that share the rest of the budget: running prefills oldest first, then waiting ones
// admitted FCFS (slot + prefix match) while each participant can still get a token.
std::vector<Sequence*> Scheduler::admit_prefills(int64_t budget, const std::vector<ScheduledSeq>& planned) {
  std::vector<Sequence*> prefills;
  for (auto& r : running_) {
    const Sequence* s = r.get();
    const bool has_chunk = std::any_of(planned.begin(), planned.end(), [s](const ScheduledSeq& p) { return p.seq == s; });
    if (!has_chunk && r->remaining() > 1 && static_cast<int64_t>(prefills.size()) < budget) prefills.push_back(r.get());
  }
  while (!waiting_.empty() && static_cast<int64_t>(prefills.size()) < budget &&
         static_cast<int64_t>(running_.size()) < opt_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    if (!cache_.acquire_slot(s.cache())) break;
    const int64_t hit = cache_.match_prefix(s.cache(), s.tokens());
    if (hit > 0) s.set_cached_prompt_tokens(std::min(hit, s.prompt_len()));
    s.admitted_order = ++admitted_;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    prefills.push_back(&s);
  }
  return prefills;
}

std::vector<ScheduledSeq> Scheduler::schedule() {
  std::vector<ScheduledSeq> out;
  int64_t budget = opt_.max_num_batched_tokens;
  schedule_decodes(out, budget);
  if (budget == 0) return out;
  const int64_t first_fresh = admitted_ + 1;  // admissions of this step have admitted_order >= this
  std::vector<Sequence*> prefills = admit_prefills(budget, out);

  // 3. Water-filling: in order of growing demand, each takes min(demand, an equal share of what is left).
  const size_t m = prefills.size();
  std::vector<int64_t> demand(m), share(m);
  for (size_t i = 0; i < m; ++i) demand[i] = chunk_for(*prefills[i], budget);
  std::vector<size_t> by_demand(m);
  std::iota(by_demand.begin(), by_demand.end(), size_t{0});
  std::stable_sort(by_demand.begin(), by_demand.end(), [&](size_t a, size_t b) { return demand[a] < demand[b]; });
  int64_t left = budget;
  for (size_t k = 0; k < m; ++k) {
    const size_t i = by_demand[k];
    share[i] = std::min(demand[i], left / static_cast<int64_t>(m - k));  // >= 1: m <= budget
    left -= share[i];
  }

  // 4. Pages, in admission order. A new admission that does not fit goes back to the queue with every
  // admission after it (FCFS order kept); a running one that does not fit even alone is requeued.
  for (size_t i = 0; i < m; ++i) {
    Sequence* s = prefills[i];
    if (!is_running(s)) continue;  // preempted for an older one
    if (reserve(*s, share[i], out, first_fresh)) {
      out.push_back({s, share[i], share[i] == s->remaining()});
      continue;
    }
    if (s->admitted_order < first_fresh) {
      requeue(s, true);
      continue;
    }
    for (size_t j = m; j-- > i;)
      if (is_running(prefills[j])) requeue(prefills[j], false);
    break;
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
