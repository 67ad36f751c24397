#include "k3/runtime/expert_residency.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>

#include "k3/core/error.h"

namespace k3 {

ExpertPrefetch parse_expert_prefetch(const std::string& s) {
  if (s == "none") return ExpertPrefetch::None;
  if (s == "madvise") return ExpertPrefetch::Madvise;
  if (s == "threads") return ExpertPrefetch::Threads;
  throw Error("--expert-prefetch '" + s + "': expected none, madvise or threads");
}

const char* expert_prefetch_name(ExpertPrefetch p) {
  switch (p) {
    case ExpertPrefetch::None: return "none";
    case ExpertPrefetch::Madvise: return "madvise";
    default: return "threads";
  }
}

DiskCounters read_disk_counters() {
  DiskCounters c;
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t v = 0;
  while (io >> key >> v)
    if (key == "read_bytes:") c.read_bytes = v;
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) c.major_faults = ru.ru_majflt;
  return c;
}

std::vector<ByteSpan> page_spans(std::vector<ByteSpan> spans, const uint8_t* region, size_t region_size,
                                 size_t page) {
  const auto lo_limit = reinterpret_cast<uintptr_t>(region) / page * page;
  const uintptr_t hi_limit = (reinterpret_cast<uintptr_t>(region) + region_size + page - 1) / page * page;
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  for (const ByteSpan& s : spans) {
    if (s.size == 0) continue;
    uintptr_t b = reinterpret_cast<uintptr_t>(s.data) / page * page;
    uintptr_t e = (reinterpret_cast<uintptr_t>(s.data) + s.size + page - 1) / page * page;
    b = std::max(b, lo_limit);
    e = std::min(e, hi_limit);
    if (b < e) r.emplace_back(b, e);
  }
  std::sort(r.begin(), r.end());
  std::vector<ByteSpan> out;
  for (auto [b, e] : r) {
    if (!out.empty()) {
      ByteSpan& last = out.back();
      const auto last_end = reinterpret_cast<uintptr_t>(last.data) + last.size;
      if (b <= last_end) {  // touching or overlapping (both page-aligned): one range
        last.size = std::max(last_end, e) - reinterpret_cast<uintptr_t>(last.data);
        continue;
      }
    }
    out.push_back({reinterpret_cast<const uint8_t*>(b), static_cast<size_t>(e - b)});
  }
  return out;
}

// Reader threads: fault queued ranges in (MADV_POPULATE_READ, else one read per page), in queue order,
// while the caller computes. A new step's routing replaces what is still queued: the caller has already
// faulted in (and used) the previous layer's experts by then.
struct ExpertResidency::Readers {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ByteSpan> queue;
  bool stop = false;
  std::vector<std::thread> threads;

  explicit Readers(int n) {
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { run(); });
  }
  ~Readers() {
    {
      std::lock_guard lk(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
  void replace(std::vector<ByteSpan> spans) {
    {
      std::lock_guard lk(mu);
      queue.assign(spans.begin(), spans.end());
    }
    if (!spans.empty()) cv.notify_all();  // nothing to read (every expert resident): no wake-up per layer
  }
  void run() {
    for (;;) {
      ByteSpan s;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return stop || !queue.empty(); });
        if (stop) return;
        s = queue.front();
        queue.pop_front();
      }
      populate(s);
    }
  }
  static void populate(ByteSpan s) {
#ifdef MADV_POPULATE_READ
    if (::madvise(const_cast<uint8_t*>(s.data), s.size, MADV_POPULATE_READ) == 0) return;
#endif
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    volatile uint8_t sink = 0;
    for (size_t o = 0; o < s.size; o += page) sink = sink + s.data[o];
    (void)sink;
  }
};

ExpertResidency::ExpertResidency(ExpertResidencyOptions opt, std::vector<ByteSpan> regions)
    : opt_(opt), regions_(std::move(regions)), page_(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
  if (opt_.enabled && opt_.prefetch == ExpertPrefetch::Threads)
    readers_ = std::make_unique<Readers>(std::max(1, opt_.prefetch_threads));
  if (opt_.hot_budget_bytes < 0) opt_.hot_budget_bytes = 0;  // the caller resolves kAutoBudget
}

ExpertResidency::~ExpertResidency() {
  readers_.reset();
  for (Layer& l : layers_)
    for (Expert& e : l.experts)
      if (e.locked) unlock(e);
}

int64_t ExpertResidency::auto_budget(int64_t other_bytes) {
  std::ifstream mi("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0, avail = -1;
  while (mi >> key >> kb) {
    std::getline(mi, unit);
    if (key == "MemAvailable:") avail = kb * 1024;
  }
  if (avail < 0) avail = static_cast<int64_t>(::sysconf(_SC_AVPHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  return std::max<int64_t>(0, avail / 2 - other_bytes);
}

void ExpertResidency::add_layer(const void* key, const std::vector<std::vector<ByteSpan>>& experts) {
  Layer l;
  l.experts.resize(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    Expert& e = l.experts[i];
    for (const ByteSpan& region : regions_) {
      std::vector<ByteSpan> inside;
      for (const ByteSpan& s : experts[i])
        if (s.data >= region.data && s.data < region.data + region.size) inside.push_back(s);
      for (const ByteSpan& p : page_spans(inside, region.data, region.size, page_)) e.spans.push_back(p);
    }
    for (const ByteSpan& s : e.spans) e.bytes += static_cast<int64_t>(s.size);
    expert_bytes_total_ += e.bytes;
  }
  experts_total_ += static_cast<int64_t>(experts.size());
  layer_of_[key] = layers_.size();
  layers_.push_back(std::move(l));
}

int64_t ExpertResidency::missing_bytes(const Expert& e) const {
  int64_t missing = 0;
  std::vector<unsigned char> vec;
  for (const ByteSpan& s : e.spans) {
    vec.resize(s.size / page_);
    if (::mincore(const_cast<uint8_t*>(s.data), s.size, vec.data()) != 0) return e.bytes;  // unknown: count as missing
    for (unsigned char v : vec)
      if (!(v & 1)) missing += static_cast<int64_t>(page_);
  }
  return missing;
}

bool ExpertResidency::resident(const Expert& e) const { return missing_bytes(e) == 0; }

void ExpertResidency::prefetch(const Expert& e) {
  for (const ByteSpan& s : e.spans) ::madvise(const_cast<uint8_t*>(s.data), s.size, MADV_WILLNEED);
}

void ExpertResidency::lock(Expert& e) {
  for (const ByteSpan& s : e.spans)
    if (::mlock(s.data, s.size) != 0) {
      pin_ok_ = false;  // no CAP_IPC_LOCK / RLIMIT_MEMLOCK too small: count the hot set, pin nothing
      for (const ByteSpan& t : e.spans) ::munlock(t.data, t.size);
      return;
    }
  e.locked = true;
  std::lock_guard lk(mu_);
  hot_bytes_ += e.bytes;
  ++hot_experts_;
}

void ExpertResidency::unlock(Expert& e) {
  for (const ByteSpan& s : e.spans) {
    ::munlock(s.data, s.size);
    ::madvise(const_cast<uint8_t*>(s.data), s.size, MADV_COLD);  // first to go when memory is short
  }
  e.locked = false;
  std::lock_guard lk(mu_);
  hot_bytes_ -= e.bytes;
  --hot_experts_;
}

// The hot set: experts by decaying use count, most used first, up to the budget. Scores halve at every
// rebalance, so the set follows a change of topic within a few rebalances.
void ExpertResidency::rebalance() {
  std::vector<Expert*> all;
  for (Layer& l : layers_)
    for (Expert& e : l.experts) {
      e.score *= 0.5;
      e.want_hot = false;
      if (e.score > 0) all.push_back(&e);
    }
  std::sort(all.begin(), all.end(), [](const Expert* a, const Expert* b) { return a->score > b->score; });
  int64_t budget = opt_.hot_budget_bytes;
  for (Expert* e : all) {
    if (e->bytes > budget) break;
    budget -= e->bytes;
    e->want_hot = true;
  }
  for (Expert* e : all)
    if (e->locked && !e->want_hot) unlock(*e);
  for (Layer& l : layers_)  // experts whose score decayed to 0 are not in `all`
    for (Expert& e : l.experts)
      if (e.locked && !e.want_hot) unlock(e);
}

void ExpertResidency::on_routed(const void* key, std::vector<int64_t>& experts) {
  if (!opt_.enabled) return;
  auto it = layer_of_.find(key);
  if (it == layer_of_.end()) return;
  Layer& layer = layers_[it->second];
  if (it->second == 0 && ++steps_ % opt_.rebalance_every == 0 && opt_.hot_budget_bytes > 0 && pin_ok_) rebalance();
  std::vector<int64_t> hit, miss;
  int64_t needed = 0, missing = 0;
  const int64_t step = layer.steps++;
  for (int64_t id : experts) {
    if (id < 0 || id >= static_cast<int64_t>(layer.experts.size())) continue;
    Expert& e = layer.experts[static_cast<size_t>(id)];
    e.score += 1.0;
    const bool trusted = e.resident_at >= 0 && step - e.resident_at <= opt_.trust_resident_steps;
    const int64_t m = trusted ? 0 : missing_bytes(e);
    if (m == 0 && !trusted) e.resident_at = step;
    needed += e.bytes;
    missing += m;
    (m == 0 ? hit : miss).push_back(id);
  }
  // Both modes start the reads of exactly the missing experts' bytes (MADV_WILLNEED, asynchronous): a
  // fault on a page not yet in the page cache would read the kernel's whole read-around window
  // (read_ahead_kb, 8 MB here: five experts' worth of neighbours) instead.
  if (opt_.prefetch != ExpertPrefetch::None)
    for (int64_t id : miss) prefetch(layer.experts[static_cast<size_t>(id)]);
  if (opt_.prefetch == ExpertPrefetch::Threads) {  // and map them in while the caller computes
    std::vector<ByteSpan> q;
    constexpr size_t kChunk = size_t{256} << 10;  // several readers share one expert
    for (int64_t id : miss)
      for (const ByteSpan& s : layer.experts[static_cast<size_t>(id)].spans)
        for (size_t o = 0; o < s.size; o += kChunk) q.push_back({s.data + o, std::min(kChunk, s.size - o)});
    readers_->replace(std::move(q));
  }
  if (pin_ok_)
    for (int64_t id : hit) {
      Expert& e = layer.experts[static_cast<size_t>(id)];
      if (e.want_hot && !e.locked) lock(e);
    }
  if (opt_.prefetch != ExpertPrefetch::None) {  // resident ones first: computed while the rest is read
    experts.assign(hit.begin(), hit.end());
    experts.insert(experts.end(), miss.begin(), miss.end());
  }
  std::lock_guard lk(mu_);
  lookups_ += static_cast<int64_t>(hit.size() + miss.size());
  hits_ += static_cast<int64_t>(hit.size());
  needed_bytes_ += needed;
  missing_bytes_ += missing;
  if (opt_.prefetch != ExpertPrefetch::None) prefetched_ += static_cast<int64_t>(miss.size());
}

bool ExpertResidency::pinned(const void* key, int64_t id) const {
  auto it = layer_of_.find(key);
  if (it == layer_of_.end()) return false;
  const Layer& l = layers_[it->second];
  return id >= 0 && id < static_cast<int64_t>(l.experts.size()) && l.experts[static_cast<size_t>(id)].locked;
}

ExpertCacheStats ExpertResidency::stats() const {
  ExpertCacheStats s;
  s.enabled = opt_.enabled;
  s.prefetch = opt_.enabled ? expert_prefetch_name(opt_.prefetch) : "off";
  s.experts_total = experts_total_;
  s.expert_bytes_total = expert_bytes_total_;
  s.hot_budget_bytes = opt_.hot_budget_bytes;
  s.disk = read_disk_counters();
  std::lock_guard lk(mu_);
  s.lookups = lookups_;
  s.hits = hits_;
  s.needed_bytes = needed_bytes_;
  s.missing_bytes = missing_bytes_;
  s.prefetched_experts = prefetched_;
  s.hot_bytes = hot_bytes_;
  s.hot_experts = hot_experts_;
  s.pinning = pin_ok_ && opt_.hot_budget_bytes > 0;
  return s;
}

}  // namespace k3
