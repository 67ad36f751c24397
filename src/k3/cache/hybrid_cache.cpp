#include "k3/cache/hybrid_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "k3/core/error.h"

namespace k3::cache {

namespace {
std::string mib(int64_t b) { return std::to_string(b / (1 << 20)) + " MiB"; }
}  // namespace

// ---- PagedSequence -------------------------------------------------------------------------------

const CacheSpec& PagedSequence::spec() const { return cache_->spec_; }

KdaStateView PagedSequence::kda_state(int64_t i) {
  HybridCache& c = *cache_;
  uint8_t* b = c.slot_ptr(slot_) + i * c.spec_.kda_layer_bytes();
  float* conv = reinterpret_cast<float*>(b + c.spec_.kda_state_bytes());
  const int64_t cf = c.spec_.kda_conv_floats;
  return {b, conv, conv + cf, conv + 2 * cf};
}

KdaStateView PagedSequence::kda_snapshot(int64_t i, int64_t j) {
  HybridCache& c = *cache_;
  if (j < 0 || j >= static_cast<int64_t>(snap_slots_.size())) return {};
  uint8_t* b = c.slot_ptr(snap_slots_[static_cast<size_t>(j)]) + i * c.spec_.kda_layer_bytes();
  float* conv = reinterpret_cast<float*>(b + c.spec_.kda_state_bytes());
  const int64_t cf = c.spec_.kda_conv_floats;
  return {b, conv, conv + cf, conv + 2 * cf};
}

MlaPageTable PagedSequence::mla_pages() {
  HybridCache& c = *cache_;
  page_ptrs_.resize(pages_.size());
  for (size_t j = 0; j < pages_.size(); ++j) page_ptrs_[j] = c.page_ptr(pages_[j]);
  return MlaPageTable{page_ptrs_, c.B_, c.B_ * c.spec_.mla_row_bytes(), c.spec_.mla_row_bytes()};
}

int64_t PagedSequence::capacity_tokens() const { return static_cast<int64_t>(pages_.size()) * cache_->B_; }

void PagedSequence::reserve(int64_t n) {
  if (slot_ < 0 || n_past_ + n > capacity_tokens())
    throw Error("internal error: the scheduler ran a sequence without cache pages or a state slot for it");
}

uint64_t cache_salt_id(std::string_view salt) {
  if (salt.empty()) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a finaliser
  for (unsigned char c : salt) h = (h ^ c) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h ? h : 1;
}

// ---- HybridCache ---------------------------------------------------------------------------------

namespace {
// Pages and slots in whole 256-byte units: every page and slot stays aligned for the kernels' vector loads.
int64_t units256(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + 255) / 256 * 256; }
}  // namespace

int64_t HybridCache::budget_for(const CacheSpec& spec, int64_t page_tokens, int64_t seqs, int64_t tokens,
                                int64_t state_snapshots) {
  const int64_t pages = (tokens + page_tokens - 1) / page_tokens;
  return seqs * ((1 + state_snapshots) * units256(spec.slot_bytes()) + pages * units256(spec.page_bytes(page_tokens)));
}

int64_t HybridCache::auto_checkpoint_interval() const {
  const double per_token = static_cast<double>(page_bytes_) / static_cast<double>(B_);  // bytes per token
  const double tokens = static_cast<double>(slot_bytes_) / std::max(per_token, 4.0);
  const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(tokens)), 64, 65536);
  return (n + B_ - 1) / B_ * B_;
}

HybridCache::HybridCache(const ModelConfig& cfg, const CacheOptions& opt) : HybridCache(make_cache_spec(cfg), opt) {}

HybridCache::HybridCache(const CacheSpec& spec, const CacheOptions& opt) : spec_(spec), opt_(opt) {
  if (opt.page_tokens < 1) throw Error("page size must be at least one token");
  B_ = opt.page_tokens;
  page_bytes_ = units256(spec.page_bytes(B_));
  slot_bytes_ = units256(spec.slot_bytes());

  const int64_t slot_b = slot_bytes_, page_b = page_bytes_;
  if (opt.state_snapshots < 0 || opt.state_snapshots > 64) throw Error("state snapshots per sequence must be in [0, 64]");
  running_slots_ = opt.max_num_seqs * (1 + opt.state_snapshots);
  if (running_slots_ * slot_b + page_b > opt.budget_bytes)
    throw Error("cache memory " + mib(opt.budget_bytes) + " is too small: " + std::to_string(opt.max_num_seqs) +
                " sequences need " + mib(running_slots_ * slot_b) + " of KDA state (" + std::to_string(slot_b) +
                 " bytes each" + (opt.state_snapshots > 0 ? ", " + std::to_string(1 + opt.state_snapshots) + " each: speculative decoding keeps snapshots" : "") +
                ") plus latent pages; raise --cache-memory or lower --max-num-seqs");
  // Default: a quarter of what is left after the running sequences' slots, at least max_num_seqs
  // (with only 64 checkpoints, a load test of 256 distinct prompts repeated once hit 16.8k of ~48k prompt tokens).
  const int64_t rest = opt.budget_bytes - running_slots_ * slot_b;
  int64_t ckpt = opt.prefix_caching
                     ? (opt.checkpoint_slots < 0 ? std::max(opt.max_num_seqs, rest / 4 / slot_b) : opt.checkpoint_slots)
                     : 0;
  // Checkpoints may take at most half of what is left after the running sequences' slots.
  ckpt = std::min(ckpt, (opt.budget_bytes - running_slots_ * slot_b) / 2 / slot_b);
  n_slots_ = running_slots_ + ckpt;
  n_pages_ = (opt.budget_bytes - n_slots_ * slot_b) / page_b;

  // Allocated but not touched: memory is committed page by page as sequences use it.
  // One allocation for the whole budget (pages, then slots): the cache is one region of the process's
  // memory, sized once, that fills as it is used.
  mem_ = opt.memory ? opt.memory : host_cache_memory();
  arena_ = mem_->allocate(static_cast<size_t>(n_pages_ * page_bytes_ + n_slots_ * slot_bytes_));
  pages_ = arena_;
  slots_ = arena_ + n_pages_ * page_bytes_;
  page_meta_.resize(static_cast<size_t>(n_pages_));
  for (int64_t p = n_pages_ - 1; p >= 0; --p) free_pages_.push_back(static_cast<int32_t>(p));
  for (int64_t s = n_slots_ - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
}

HybridCache::~HybridCache() {
  if (arena_) mem_->release(arena_);
}

uint64_t HybridCache::block_key(int32_t parent, std::span<const int32_t> toks, uint64_t salt) {
  uint64_t h = (0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(static_cast<int64_t>(parent))) + salt * 0xc2b2ae3d27d4eb4full;
  for (int32_t t : toks) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

int32_t HybridCache::find_child(int32_t parent, std::span<const int32_t> toks, uint64_t salt) const {
  auto [b, e] = trie_.equal_range(block_key(parent, toks, salt));
  for (auto it = b; it != e; ++it) {
    const Page& pg = page_meta_[static_cast<size_t>(it->second)];
    // The salt is compared, not only hashed: a chain's root is where partitions separate.
    if (pg.parent == parent && pg.salt == salt && std::equal(pg.tokens.begin(), pg.tokens.end(), toks.begin(), toks.end())) return it->second;
  }
  return -1;
}

void HybridCache::ref_page(int32_t p, bool by_checkpoint) {
  Page& pg = page_meta_[static_cast<size_t>(p)];
  if (pg.in_lru) {
    page_lru_.erase(pg.lru);
    pg.in_lru = false;
  }
  if (!by_checkpoint && pg.refs == pg.ckpt_refs) ++pages_used_;  // first sequence reference
  ++pg.refs;
  if (by_checkpoint) ++pg.ckpt_refs;
}

void HybridCache::unref_page(int32_t p, bool by_checkpoint) {
  Page& pg = page_meta_[static_cast<size_t>(p)];
  --pg.refs;
  if (by_checkpoint) --pg.ckpt_refs;
  if (!by_checkpoint && pg.refs == pg.ckpt_refs) --pages_used_;  // last sequence reference gone
  if (pg.refs > 0) return;
  if (pg.in_trie) {
    pg.lru = page_lru_.insert(page_lru_.end(), p);
    pg.in_lru = true;
  } else {
    free_pages_.push_back(p);
  }
}

bool HybridCache::evict_one_page() {
  for (auto it = page_lru_.begin(); it != page_lru_.end(); ++it) {
    const int32_t p = *it;
    Page& pg = page_meta_[static_cast<size_t>(p)];
    if (pg.children > 0) continue;  // only leaves: a cached prefix stays a chain
    auto [b, e] = trie_.equal_range(pg.key);
    for (auto t = b; t != e; ++t)
      if (t->second == p) {
        trie_.erase(t);
        break;
      }
    if (pg.parent >= 0) --page_meta_[static_cast<size_t>(pg.parent)].children;
    page_lru_.erase(it);
    pg = Page{};
    free_pages_.push_back(p);
    return true;
  }
  return false;
}

void HybridCache::drop_checkpoint(int32_t id) {
  Checkpoint& c = ckpts_[static_cast<size_t>(id)];
  free_slots_.push_back(c.slot);
  auto [b, e] = ckpt_by_page_.equal_range(c.last_page);
  for (auto it = b; it != e; ++it)
    if (it->second == id) {
      ckpt_by_page_.erase(it);
      break;
    }
  ckpt_lru_.erase(c.lru);
  if (c.last_page >= 0) unref_page(c.last_page, true);
  if (c.snapshot_page >= 0) unref_page(c.snapshot_page, true);
  c = Checkpoint{};
  free_ckpt_ids_.push_back(id);
  --n_ckpts_;
}

bool HybridCache::evict_one_checkpoint() {
  if (ckpt_lru_.empty()) return false;
  drop_checkpoint(ckpt_lru_.front());
  return true;
}

int32_t HybridCache::alloc_page() {
  while (free_pages_.empty())
    if (!evict_one_page() && !evict_one_checkpoint()) return -1;
  const int32_t p = free_pages_.back();
  free_pages_.pop_back();
  page_meta_[static_cast<size_t>(p)] = Page{};
  page_meta_[static_cast<size_t>(p)].refs = 1;  // the caller's reference (a sequence's, or see save_checkpoint)
  ++pages_used_;
  return p;
}

int32_t HybridCache::alloc_slot() {
  while (free_slots_.empty())
    if (!evict_one_checkpoint()) return -1;
  const int32_t s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

bool HybridCache::acquire_slot(PagedSequence& s) {
  if (s.slot_ >= 0) return true;
  const int32_t slot = alloc_slot();
  if (slot < 0) return false;
  for (int64_t j = 0; j < opt_.state_snapshots; ++j) {
    const int32_t snap = alloc_slot();
    if (snap < 0) {
      free_slots_.push_back(slot);
      for (int32_t q : s.snap_slots_) free_slots_.push_back(q);
      slots_used_ -= static_cast<int64_t>(s.snap_slots_.size());
      s.snap_slots_.clear();
      return false;
    }
    s.snap_slots_.push_back(snap);
    ++slots_used_;
  }
  mem_->zero(slot_ptr(slot), static_cast<size_t>(slot_bytes_));
  s.slot_ = slot;
  ++slots_used_;
  return true;
}

void HybridCache::restore_state(PagedSequence& s, int64_t j, int64_t snapshot_pos, int64_t keep_tokens) {
  if (j < 0 || j >= static_cast<int64_t>(s.snap_slots_.size()) || snapshot_pos > s.n_past_ ||
      snapshot_pos < s.committed_pages_ * B_)
    throw Error("internal error: a state restore without a snapshot, or to a committed position");
  std::swap(s.slot_, s.snap_slots_[static_cast<size_t>(j)]);
  s.n_past_ = snapshot_pos;
  // Pages only the rejected rows needed go back (never a committed one: those lie below n_past).
  const int64_t keep_pages = std::max<int64_t>((keep_tokens + B_ - 1) / B_, (s.n_past_ + B_ - 1) / B_);
  while (static_cast<int64_t>(s.pages_.size()) > std::max(keep_pages, s.committed_pages_)) {
    unref_page(s.pages_.back(), false);
    s.pages_.pop_back();
  }
}

int64_t HybridCache::pages_needed(const PagedSequence& s, int64_t tokens) const {
  return std::max<int64_t>(0, (tokens + B_ - 1) / B_ - static_cast<int64_t>(s.pages_.size()));
}

bool HybridCache::ensure_capacity(PagedSequence& s, int64_t tokens) {
  const int64_t need = pages_needed(s, tokens);
  std::vector<int32_t> got;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t p = alloc_page();
    if (p < 0) {
      for (int32_t q : got) unref_page(q, false);
      return false;
    }
    got.push_back(p);
  }
  s.pages_.insert(s.pages_.end(), got.begin(), got.end());
  return true;
}

void HybridCache::release(PagedSequence& s) {
  for (int32_t p : s.pages_) unref_page(p, false);
  s.pages_.clear();
  if (s.slot_ >= 0) {
    free_slots_.push_back(s.slot_);
    --slots_used_;
    s.slot_ = -1;
  }
  for (int32_t q : s.snap_slots_) free_slots_.push_back(q);
  slots_used_ -= static_cast<int64_t>(s.snap_slots_.size());
  s.snap_slots_.clear();
  s.n_past_ = 0;
  s.committed_pages_ = 0;
}

int64_t HybridCache::match_prefix(PagedSequence& s, std::span<const int32_t> tokens) {
  const int64_t L = static_cast<int64_t>(tokens.size());
  query_tokens_ += L;
  if (!opt_.prefix_caching || s.slot_ < 0 || s.n_past_ != 0 || !s.pages_.empty() || L < 2) return 0;
  const int64_t max_hit = L - 1;
  std::vector<int32_t> chain;
  for (int32_t parent = -1; static_cast<int64_t>(chain.size() + 1) * B_ <= max_hit;) {
    const int64_t j = static_cast<int64_t>(chain.size());
    const int32_t p =
        find_child(parent, tokens.subspan(static_cast<size_t>(j * B_), static_cast<size_t>(B_)), s.salt_);
    if (p < 0) break;
    chain.push_back(p);
    parent = p;
  }
  // The longest checkpoint along the chain: those after more full pages are always longer.
  int32_t best = -1;
  for (int64_t k = static_cast<int64_t>(chain.size()); k >= 0 && best < 0; --k) {
    const int32_t last = k > 0 ? chain[static_cast<size_t>(k - 1)] : -1;
    auto [b, e] = ckpt_by_page_.equal_range(last);
    for (auto it = b; it != e; ++it) {
      const Checkpoint& c = ckpts_[static_cast<size_t>(it->second)];
      if (c.pos > max_hit || c.salt != s.salt_) continue;
      if (!std::equal(c.partial.begin(), c.partial.end(), tokens.begin() + k * B_)) continue;
      if (best < 0 || c.pos > ckpts_[static_cast<size_t>(best)].pos) best = it->second;
    }
  }
  if (best < 0) return 0;
  // Copy what is needed out of the checkpoint and pin its pages first: taking a page below may evict
  // cached pages and checkpoints, this one included.
  ckpt_lru_.splice(ckpt_lru_.end(), ckpt_lru_, ckpts_[static_cast<size_t>(best)].lru);
  const int64_t pos = ckpts_[static_cast<size_t>(best)].pos, k = pos / B_;
  const int32_t snap = ckpts_[static_cast<size_t>(best)].snapshot_page;
  mem_->copy(slot_ptr(s.slot_), slot_ptr(ckpts_[static_cast<size_t>(best)].slot), static_cast<size_t>(slot_bytes_));
  for (int64_t j = 0; j < k; ++j) ref_page(chain[static_cast<size_t>(j)], false);
  s.pages_.assign(chain.begin(), chain.begin() + k);
  if (snap >= 0) {
    ref_page(snap, false);
    const int32_t q = alloc_page();
    if (q >= 0) mem_->copy(page_ptr(q), page_ptr(snap), static_cast<size_t>(page_bytes_));
    unref_page(snap, false);
    if (q < 0) {
      for (int32_t p : s.pages_) unref_page(p, false);
      s.pages_.clear();
      mem_->zero(slot_ptr(s.slot_), static_cast<size_t>(slot_bytes_));
      return 0;
    }
    s.pages_.push_back(q);
  }
  s.n_past_ = pos;
  s.committed_pages_ = k;
  hit_tokens_ += pos;
  return pos;
}

void HybridCache::commit_pages(PagedSequence& s, std::span<const int32_t> tokens) {
  if (!opt_.prefix_caching) return;
  for (int64_t j = s.committed_pages_; (j + 1) * B_ <= s.n_past_; ++j) {
    const int32_t p = s.pages_[static_cast<size_t>(j)];
    const int32_t parent = j > 0 ? s.pages_[static_cast<size_t>(j - 1)] : -1;
    auto block = tokens.subspan(static_cast<size_t>(j * B_), static_cast<size_t>(B_));
    const int32_t existing = find_child(parent, block, s.salt_);
    if (existing >= 0 && existing != p) {
      // Same prefix computed twice: the rows are bit-identical (the forward is batch-invariant), so
      // the sequence switches to the cached page and its own copy goes back to the pool.
      ref_page(existing, false);
      s.pages_[static_cast<size_t>(j)] = existing;
      unref_page(p, false);
    } else if (existing < 0) {
      Page& pg = page_meta_[static_cast<size_t>(p)];
      pg.in_trie = true;
      pg.parent = parent;
      pg.tokens.assign(block.begin(), block.end());
      pg.salt = s.salt_;
      pg.key = block_key(parent, block, s.salt_);
      trie_.emplace(pg.key, p);
      if (parent >= 0) ++page_meta_[static_cast<size_t>(parent)].children;
    }
    s.committed_pages_ = j + 1;
  }
}

void HybridCache::save_checkpoint(PagedSequence& s, std::span<const int32_t> tokens) {
  if (!opt_.prefix_caching || s.slot_ < 0 || s.n_past_ == 0) return;
  const int64_t pos = s.n_past_, k = pos / B_, r = pos % B_;
  if (s.committed_pages_ < k) return;
  const int32_t last = k > 0 ? s.pages_[static_cast<size_t>(k - 1)] : -1;
  auto partial = tokens.subspan(static_cast<size_t>(k * B_), static_cast<size_t>(r));
  auto [b, e] = ckpt_by_page_.equal_range(last);
  for (auto it = b; it != e; ++it) {
    Checkpoint& c = ckpts_[static_cast<size_t>(it->second)];
    if (c.salt == s.salt_ && std::equal(c.partial.begin(), c.partial.end(), partial.begin(), partial.end())) {
      ckpt_lru_.splice(ckpt_lru_.end(), ckpt_lru_, c.lru);
      return;
    }
  }
  // Checkpoints only use free slots or replace older checkpoints; they never take a running
  // sequence's capacity (at most n_slots - max_num_seqs of them exist).
  if (n_ckpts_ >= n_slots_ - running_slots_) {
    if (!evict_one_checkpoint()) return;
  }
  if (free_slots_.empty()) return;
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  int32_t snap = -1;
  if (r > 0) {
    // Pin the sequence's pages while the snapshot page is taken (eviction never touches them).
    snap = alloc_page();
    if (snap < 0) {
      free_slots_.push_back(slot);
      return;
    }
    mem_->copy(page_ptr(snap), page_ptr(s.pages_[static_cast<size_t>(k)]), static_cast<size_t>(page_bytes_));
    ++page_meta_[static_cast<size_t>(snap)].ckpt_refs;  // the reference is the checkpoint's
    --pages_used_;
  }
  mem_->copy(slot_ptr(slot), slot_ptr(s.slot_), static_cast<size_t>(slot_bytes_));
  if (last >= 0) ref_page(last, true);
  int32_t id;
  if (!free_ckpt_ids_.empty()) {
    id = free_ckpt_ids_.back();
    free_ckpt_ids_.pop_back();
  } else {
    id = static_cast<int32_t>(ckpts_.size());
    ckpts_.emplace_back();
  }
  Checkpoint& c = ckpts_[static_cast<size_t>(id)];
  c.slot = slot;
  c.last_page = last;
  c.partial.assign(partial.begin(), partial.end());
  c.snapshot_page = snap;
  c.pos = pos;
  c.salt = s.salt_;
  c.lru = ckpt_lru_.insert(ckpt_lru_.end(), id);
  ckpt_by_page_.emplace(last, id);
  ++n_ckpts_;
}

int64_t HybridCache::count_used_pages_slow() const {
  int64_t n = 0;
  for (const Page& p : page_meta_) n += (p.refs - p.ckpt_refs > 0);
  return n;
}

CacheStats HybridCache::stats() const {
  CacheStats st;
  st.pages_total = n_pages_;
  st.pages_used = pages_used_;  // kept incrementally: stats() runs every engine step
  st.pages_cached = n_pages_ - static_cast<int64_t>(free_pages_.size()) - st.pages_used;
  st.slots_total = n_slots_;
  st.slots_used = slots_used_;
  st.checkpoints = n_ckpts_;
  st.bytes_total = n_pages_ * page_bytes_ + n_slots_ * slot_bytes_;
  st.bytes_used = st.pages_used * page_bytes_ + slots_used_ * slot_bytes_;
  st.prefix_query_tokens = query_tokens_;
  st.prefix_hit_tokens = hit_tokens_;
  return st;
}

}  // namespace k3::cache
