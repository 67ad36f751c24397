// Expert-aware residency of routed experts that stay file-backed in the checkpoint's mapping (models
// bigger than RAM, docs/bigger-than-ram.md). The page cache holds what fits; this module helps it:
//  - counts every (layer, expert) use the router makes, and whether the expert was already resident
//    (mincore) when it was needed: the hit rate;
//  - prefetches the experts a step needs as soon as routing is known (MADV_WILLNEED from the caller, or
//    reader threads that fault the pages in with MADV_POPULATE_READ), and orders the work so that the
//    resident experts are computed while the others are read;
//  - keeps a hot set (the most used experts, by a decaying count, up to a byte budget) resident with
//    mlock (when permitted) and marks experts that leave it MADV_COLD, so prefill scans of cold experts
//    do not push the hot ones out.
// It knows experts only as byte ranges in memory: the model registers them (Model::load), the CPU MoE
// op calls `on_routed` once per layer and step. Nothing here reads a weight's value.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace k3 {

enum class ExpertPrefetch { None, Madvise, Threads };

struct ExpertResidencyOptions {
  bool enabled = true;
  ExpertPrefetch prefetch = ExpertPrefetch::Threads;
  int prefetch_threads = 2;
  // Hot-set budget in bytes: kAutoBudget = from the memory available at start (ExpertResidency::auto_budget),
  // 0 = nothing pinned (counting and prefetch only).
  static constexpr int64_t kAutoBudget = -1;
  int64_t hot_budget_bytes = kAutoBudget;
  int64_t rebalance_every = 16;  // steps of layer 0 between hot-set updates
  // An expert found fully resident is counted as resident without asking the kernel again (mincore) for this
  // many later steps of its layer (0: asked at every use). make_expert_residency sets it when the whole
  // checkpoint fits in the memory available (nothing to pin, eviction unlikely): the mincore calls of a
  // layer's routed experts (one per span) were 44 us of a kl-1b decode layer (docs/perf/cpu.md, session 25).
  // A page evicted meanwhile costs its fault, and the hit ratio counts it as resident.
  int64_t trust_resident_steps = 0;
};

// Parses --expert-prefetch (none|madvise|threads). Throws k3::Error naming the flag otherwise.
ExpertPrefetch parse_expert_prefetch(const std::string& s);
const char* expert_prefetch_name(ExpertPrefetch p);

// Process-wide I/O counters: bytes this process caused to be read from storage (/proc/self/io
// read_bytes; -1 where the kernel does not expose it) and major page faults (getrusage).
struct DiskCounters {
  int64_t read_bytes = -1;
  int64_t major_faults = 0;
};
DiskCounters read_disk_counters();

struct ExpertCacheStats {
  bool enabled = false;
  std::string prefetch;                   // none | madvise | threads
  int64_t lookups = 0, hits = 0;          // expert uses, and those fully resident when needed
  int64_t needed_bytes = 0, missing_bytes = 0;  // bytes of the used experts, and those not resident
  int64_t prefetched_experts = 0;
  int64_t hot_budget_bytes = 0, hot_bytes = 0, hot_experts = 0;  // the pinned set now
  bool pinning = false;                   // mlock works (else the hot set is only counted)
  int64_t experts_total = 0, expert_bytes_total = 0;
  DiskCounters disk;                      // process counters now (deltas are the caller's)
  double hit_ratio() const { return lookups ? double(hits) / double(lookups) : 0.0; }
};

// One contiguous byte range of an expert in memory (a tensor's data or scales).
struct ByteSpan {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// The page-aligned spans covering `spans` (merged where they touch or share a page), clipped to
// [region, region + region_size) rounded out to pages; spans outside the region are dropped.
std::vector<ByteSpan> page_spans(std::vector<ByteSpan> spans, const uint8_t* region, size_t region_size,
                                 size_t page);

class ExpertResidency {
 public:
  // `regions`: the mapped files (prefetch ranges are clipped to them). Starts the reader threads.
  ExpertResidency(ExpertResidencyOptions opt, std::vector<ByteSpan> regions);
  ~ExpertResidency();
  ExpertResidency(const ExpertResidency&) = delete;
  ExpertResidency& operator=(const ExpertResidency&) = delete;

  // Registers one MoE layer: its key (any stable pointer the caller passes back to on_routed, e.g. the
  // first expert's data) and, per expert, the byte ranges it reads. Layers in order; before any step.
  void add_layer(const void* key, const std::vector<std::vector<ByteSpan>>& experts);
  // Resolves the automatic budget: half of MemAvailable minus `other_bytes` (the weights that are not
  // routed experts, which every token reads), at least 0.
  static int64_t auto_budget(int64_t other_bytes);

  // Routing of one layer is known: `experts` (distinct ids, ascending) will be computed now. Counts the
  // uses and hits, prefetches the misses, pins hot hits, and reorders `experts` resident-first (the
  // results do not depend on the order: the caller adds outputs in id order). Unknown keys are ignored.
  void on_routed(const void* key, std::vector<int64_t>& experts);

  ExpertCacheStats stats() const;
  // Whether expert `id` of layer `key` is pinned now (tests, diagnostics); false for unknown ones.
  bool pinned(const void* key, int64_t id) const;
  const ExpertResidencyOptions& options() const { return opt_; }

 private:
  struct Expert {
    std::vector<ByteSpan> spans;  // page-aligned
    int64_t bytes = 0;
    double score = 0;             // decaying use count
    bool want_hot = false, locked = false;
    int64_t resident_at = -1;     // the layer step at which it was last found fully resident (-1: never)
  };
  struct Layer {
    std::vector<Expert> experts;
    int64_t steps = 0;            // on_routed calls of this layer
  };
  struct Readers;

  bool resident(const Expert& e) const;
  int64_t missing_bytes(const Expert& e) const;
  void prefetch(const Expert& e);
  void lock(Expert& e);
  void unlock(Expert& e);
  void rebalance();

  ExpertResidencyOptions opt_;
  std::vector<ByteSpan> regions_;
  size_t page_;
  std::unordered_map<const void*, size_t> layer_of_;
  std::vector<Layer> layers_;
  std::unique_ptr<Readers> readers_;
  int64_t steps_ = 0;
  std::atomic<bool> pin_ok_{true};  // mlock works (cleared at the first refusal)
  int64_t experts_total_ = 0, expert_bytes_total_ = 0;
  mutable std::mutex mu_;  // guards the counters below against stats() from other threads
  int64_t lookups_ = 0, hits_ = 0, needed_bytes_ = 0, missing_bytes_ = 0, prefetched_ = 0;
  int64_t hot_bytes_ = 0, hot_experts_ = 0;
};

}  // namespace k3
