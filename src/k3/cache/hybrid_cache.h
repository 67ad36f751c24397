// The hybrid cache of the serving engine: one memory budget, sized and laid out from the runner's
// CacheSpec (runtime/cache_spec.h: dtypes, bytes), split into
//   - MLA latent pages: `page_tokens` tokens x all MLA layers x one stored latent row, and
//   - KDA state slots: recurrent state + conv state of all KDA layers for one sequence.
// Sequences hold a block table of pages and one slot. Prefix caching keeps full pages in a trie keyed by
// (parent page, exact block tokens) and KDA state checkpoints at exact positions; a prefix hit is the
// longest prefix for which both the pages and a state checkpoint exist. Unreferenced cached pages and
// checkpoints are evicted LRU under the same budget. The manager knows nothing about the device or
// the scheduler's policy; it only answers "does it fit" and keeps the books.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "k3/model/config.h"
#include "k3/runtime/cache_memory.h"
#include "k3/runtime/cache_spec.h"
#include "k3/runtime/sequence_cache.h"

namespace k3::cache {

struct CacheOptions {
  int64_t budget_bytes = 512ll << 20;
  int64_t page_tokens = 16;
  int64_t max_num_seqs = 64;       // slots reserved for running sequences
  bool prefix_caching = true;
  int64_t checkpoint_slots = -1;   // extra slots for prefix checkpoints; -1: a quarter of the budget left
                                   // after the running slots (at least max_num_seqs)
  std::shared_ptr<CacheMemory> memory;  // where pages and slots live; null: host memory
  // Extra state slots per running sequence, where speculative verification saves the KDA state before
  // the draft tokens (and after each of them: one per draft position) for an exact rollback of rejected
  // drafts (restore_state). 0: none.
  int64_t state_snapshots = 0;
};

class HybridCache;

// A prefix-cache partition id for a salt string (PagedSequence::set_salt): 0 for "", else a 64-bit
// hash that is never 0. Different salts share nothing unless their hashes collide (~2^-64).
uint64_t cache_salt_id(std::string_view salt);

// One sequence's view of the cache: what Model::forward reads and writes.
class PagedSequence final : public SequenceCache {
 public:
  explicit PagedSequence(HybridCache& c) : cache_(&c) {}
  const CacheSpec& spec() const override;
  int64_t n_past() const override { return n_past_; }
  KdaStateView kda_state(int64_t kda_index) override;
  KdaStateView kda_snapshot(int64_t kda_index, int64_t j) override;  // {} past CacheOptions::state_snapshots
  MlaPageTable mla_pages() override;
  void reserve(int64_t n) override;  // checks capacity; allocation is the scheduler's job
  void advance(int64_t n) override { n_past_ += n; }
  std::unique_ptr<SequenceCache> clone() const override { return nullptr; }  // pages are shared, not cloned

  int64_t capacity_tokens() const;
  bool has_slot() const { return slot_ >= 0; }
  const std::vector<int32_t>& block_table() const { return pages_; }
  // Prefix-cache partition: pages and checkpoints are shared only between sequences with the same salt
  // (a request's cache_salt / API key; 0: none). Set before match_prefix.
  void set_salt(uint64_t salt) { salt_ = salt; }
  uint64_t salt() const { return salt_; }

 private:
  friend class HybridCache;
  HybridCache* cache_;
  int64_t n_past_ = 0;
  int32_t slot_ = -1;
  std::vector<int32_t> snap_slots_;  // CacheOptions::state_snapshots of them: saved states (restore_state)
  std::vector<int32_t> pages_;
  std::vector<uint8_t*> page_ptrs_;  // mla_pages(): the addresses of pages_
  int64_t committed_pages_ = 0;  // leading pages registered in the prefix trie (or shared from it)
  uint64_t salt_ = 0;
};

struct CacheStats {
  int64_t pages_total = 0, pages_used = 0, pages_cached = 0;  // used: referenced; cached: evictable
  int64_t slots_total = 0, slots_used = 0, checkpoints = 0;
  int64_t bytes_total = 0, bytes_used = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
};

class HybridCache {
 public:
  HybridCache(const CacheSpec& spec, const CacheOptions& opt);
  // The fp32 cache of a model (tests, tools).
  HybridCache(const ModelConfig& cfg, const CacheOptions& opt);
  // Prompt tokens between KDA state checkpoints such that a checkpoint (a whole state slot) costs no
  // more memory than the latent pages of the tokens it spans: K3's 434 MB state vs 55 KB of latents per
  // token gives ~7.9k tokens; small models get 64. A multiple of the page size, at most 65536.
  int64_t auto_checkpoint_interval() const;
  // The smallest budget_bytes that holds `seqs` sequences of `tokens` tokens each (no prefix cache), each
  // with `state_snapshots` extra state slots.
  static int64_t budget_for(const CacheSpec& spec, int64_t page_tokens, int64_t seqs, int64_t tokens,
                            int64_t state_snapshots = 0);
  ~HybridCache();
  HybridCache(const HybridCache&) = delete;
  HybridCache& operator=(const HybridCache&) = delete;

  int64_t page_tokens() const { return B_; }
  const CacheSpec& spec() const { return spec_; }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t num_pages() const { return n_pages_; }
  int64_t num_slots() const { return n_slots_; }
  bool prefix_caching() const { return opt_.prefix_caching; }
  // The most tokens one sequence could ever hold (all pages).
  int64_t max_tokens_per_sequence() const { return n_pages_ * B_; }

  // A fresh, zeroed KDA slot (evicting a checkpoint if needed). False if none can be had.
  bool acquire_slot(PagedSequence& s);
  // Pages so that the sequence can hold `tokens` tokens. All or nothing; false if the pool is exhausted.
  bool ensure_capacity(PagedSequence& s, int64_t tokens);
  // Pages that ensure_capacity would need to take from the pool.
  int64_t pages_needed(const PagedSequence& s, int64_t tokens) const;
  // Pages obtainable now (free + evictable).
  int64_t pages_available() const;
  // Drops everything the sequence holds (pages to the free list or the cache, slot to the pool).
  void release(PagedSequence& s);

  // Speculative decoding (needs CacheOptions::state_snapshots > j): the forward saved the KDA state
  // (recurrent + conv) at position `snapshot_pos` into the sequence's j-th snapshot slot (kda_snapshot,
  // BatchItem::snapshot_after). restore_state makes it the sequence's state again and sets n_past back
  // to snapshot_pos, so the MLA rows written after it are dropped (overwritten by the next tokens, never
  // committed to the prefix trie: commit_pages stops at n_past), and gives back the pages beyond what
  // `keep_tokens` tokens need. A swap of two slots: no copy.
  void restore_state(PagedSequence& s, int64_t j, int64_t snapshot_pos, int64_t keep_tokens);
  int64_t state_snapshots() const { return opt_.state_snapshots; }

  // Prefix caching. match_prefix: for a sequence with a slot and no tokens, finds the longest cached
  // prefix of `tokens` (at most tokens.size() - 1 long, so at least one token is computed), shares its
  // pages, copies the checkpointed state and sets n_past. Returns the hit length.
  int64_t match_prefix(PagedSequence& s, std::span<const int32_t> tokens);
  // Registers the sequence's full pages (tokens = everything it has computed, n_past of them) in the trie.
  void commit_pages(PagedSequence& s, std::span<const int32_t> tokens);
  // Saves the sequence's KDA state at its current n_past as a checkpoint (after commit_pages).
  void save_checkpoint(PagedSequence& s, std::span<const int32_t> tokens);

  CacheStats stats() const;
  // Recounts the pages with a sequence reference by scanning every page (stats() keeps the count
  // incrementally); for tests.
  int64_t count_used_pages_slow() const;

 private:
  friend class PagedSequence;
  struct Page {
    int32_t refs = 0;       // sequences + checkpoints using the page
    int32_t ckpt_refs = 0;  // of which checkpoints
    bool in_trie = false;
    int32_t parent = -1;
    int32_t children = 0;
    uint64_t key = 0;
    uint64_t salt = 0;            // of the sequence that computed it (every page of a chain has the root's)
    std::vector<int32_t> tokens;  // the block's tokens (for exact matching)
    std::list<int32_t>::iterator lru;
    bool in_lru = false;
  };
  struct Checkpoint {
    int32_t slot = -1;
    int32_t last_page = -1;            // last full page of the prefix (-1: none)
    std::vector<int32_t> partial;      // tokens after the last full page
    int32_t snapshot_page = -1;        // copy of the partial page's rows (-1 if partial is empty)
    int64_t pos = 0;
    uint64_t salt = 0;
    std::list<int32_t>::iterator lru;
  };

  uint8_t* page_ptr(int32_t p) { return pages_ + static_cast<size_t>(p) * static_cast<size_t>(page_bytes_); }
  uint8_t* slot_ptr(int32_t s) { return slots_ + static_cast<size_t>(s) * static_cast<size_t>(slot_bytes_); }
  int32_t alloc_page();  // -1 if none (after evicting)
  void ref_page(int32_t p, bool by_checkpoint);
  void unref_page(int32_t p, bool by_checkpoint);
  bool evict_one_page();
  bool evict_one_checkpoint();
  void drop_checkpoint(int32_t id);
  int32_t alloc_slot();  // -1 if none (after evicting checkpoints)
  static uint64_t block_key(int32_t parent, std::span<const int32_t> toks, uint64_t salt);
  int32_t find_child(int32_t parent, std::span<const int32_t> toks, uint64_t salt) const;

  CacheSpec spec_;
  CacheOptions opt_;
  int64_t B_, page_bytes_, slot_bytes_;
  int64_t n_pages_ = 0, n_slots_ = 0;
  std::shared_ptr<CacheMemory> mem_;
  uint8_t* arena_ = nullptr;  // one allocation: pages, then slots
  uint8_t* pages_ = nullptr;  // [n_pages][page_bytes]
  uint8_t* slots_ = nullptr;  // [n_slots][slot_bytes]
  std::vector<Page> page_meta_;
  std::vector<int32_t> free_pages_, free_slots_;
  std::list<int32_t> page_lru_;  // evictable cached pages, least recently used first
  std::unordered_multimap<uint64_t, int32_t> trie_;  // block_key -> page
  std::vector<Checkpoint> ckpts_;
  std::vector<int32_t> free_ckpt_ids_;
  std::list<int32_t> ckpt_lru_;
  std::unordered_multimap<int32_t, int32_t> ckpt_by_page_;  // last_page -> checkpoint id
  int64_t running_slots_ = 0;  // slots kept for running sequences (1 + state_snapshots each)
  int64_t slots_used_ = 0, n_ckpts_ = 0;
  int64_t pages_used_ = 0;  // pages with at least one sequence reference
  int64_t query_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace k3::cache
