#include "k3/text/tiktoken_bpe.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <queue>
#include <sstream>

#include "k3/core/error.h"
#include "k3/io/regular_file.h"

namespace k3::text {
namespace {

// FNV-1a: tokens are short (a few bytes), so a simple byte loop beats fancier hashes here.
inline uint32_t hash_bytes(std::string_view s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 with '=' padding; returns false on any malformation.
bool b64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=') {
        if (i + 4 != in.size() || k < 2) return false;
        v[k] = 0;
        ++pad;
      } else {
        if (pad) return false;  // data after padding
        v[k] = b64_value(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return true;
}

[[noreturn]] void fail(const std::string& origin, size_t line, const std::string& what) {
  throw Error(origin + ":" + std::to_string(line) + ": " + what);
}

constexpr int32_t kMaxRank = 1 << 24;  // sanity bound: bytes_ is indexed by rank
constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

}  // namespace

TiktokenBpe TiktokenBpe::load(const std::string& path) {
  return parse(read_regular_file(path, 256u << 20, "tokenizer file"), path);
}

TiktokenBpe TiktokenBpe::parse(std::string_view contents, const std::string& origin) {
  TiktokenBpe bpe;
  std::fill(std::begin(bpe.byte_ranks_), std::end(bpe.byte_ranks_), -1);
  // First pass counts lines to size the hash table (load factor <= 0.5).
  const size_t n_lines = std::count(contents.begin(), contents.end(), '\n') + 1;
  size_t cap = 16;
  while (cap < 2 * n_lines) cap <<= 1;
  bpe.table_.assign(cap, Slot{0, -1});

  std::string tok;
  size_t line_no = 0, pos = 0;
  while (pos < contents.size()) {
    size_t eol = contents.find('\n', pos);
    if (eol == std::string_view::npos) eol = contents.size();
    std::string_view line = contents.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // tolerate blank lines (e.g. a trailing one)
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) fail(origin, line_no, "expected 'base64 rank', missing rank");
    const std::string_view b64 = line.substr(0, sp), rank_s = line.substr(sp + 1);
    if (!b64_decode(b64, tok))
      fail(origin, line_no, "invalid base64 token '" + std::string(b64) + "'");
    int32_t rank = -1;
    const auto [ptr, ec] = std::from_chars(rank_s.data(), rank_s.data() + rank_s.size(), rank);
    if (rank_s.empty() || ec != std::errc() || ptr != rank_s.data() + rank_s.size() || rank < 0 ||
        rank >= kMaxRank)
      fail(origin, line_no, "invalid rank '" + std::string(rank_s) + "'");
    // Ranks index a table: one far beyond the number of lines would make a tiny file allocate
    // gigabytes (and leave mostly holes), so ranks must stay below the line count.
    if (static_cast<size_t>(rank) >= n_lines)
      fail(origin, line_no, "rank " + std::string(rank_s) + " is not below the number of lines (" +
                                std::to_string(n_lines) + ")");
    bpe.insert(origin, line_no, tok, rank);
  }
  if (bpe.count_ == 0) throw Error(origin + ": no tokens");
  return bpe;
}

void TiktokenBpe::insert(const std::string& origin, size_t line, std::string bytes, int32_t rank) {
  if (static_cast<size_t>(rank) >= bytes_.size()) {
    bytes_.resize(rank + 1);
    present_.resize(rank + 1, 0);
  }
  if (present_[rank]) fail(origin, line, "duplicate rank " + std::to_string(rank));
  const uint32_t h = hash_bytes(bytes);
  const size_t mask = table_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    Slot& s = table_[i];
    if (s.rank < 0) {
      s = Slot{h, rank};
      break;
    }
    if (s.hash == h && bytes_[s.rank] == bytes)
      fail(origin, line, "duplicate token (same bytes as rank " + std::to_string(s.rank) + ")");
  }
  if (bytes.size() == 1) byte_ranks_[static_cast<uint8_t>(bytes[0])] = rank;
  bytes_[rank] = std::move(bytes);
  present_[rank] = 1;
  ++count_;
}

int32_t TiktokenBpe::lookup(std::string_view bytes) const {
  const uint32_t h = hash_bytes(bytes);
  const size_t mask = table_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = table_[i];
    if (s.rank < 0) return -1;
    if (s.hash == h && bytes_[s.rank] == bytes) return s.rank;
  }
}

std::optional<int32_t> TiktokenBpe::rank(std::string_view bytes) const {
  const int32_t r = lookup(bytes);
  if (r < 0) return std::nullopt;
  return r;
}

const std::string* TiktokenBpe::bytes(int32_t r) const {
  if (r < 0 || static_cast<size_t>(r) >= bytes_.size() || !present_[r]) return nullptr;
  return &bytes_[r];
}

int32_t TiktokenBpe::byte_rank(uint8_t b) const {
  const int32_t r = byte_ranks_[b];
  if (r < 0) {
    throw Error("tokenizer vocabulary has no token for byte " + std::to_string(b) +
                ", cannot encode");
  }
  return r;
}

void TiktokenBpe::encode_piece(std::string_view piece, std::vector<int32_t>& out,
                               MergeAlgo algo) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_rank(static_cast<uint8_t>(piece[0])));
    return;
  }
  if (const int32_t r = lookup(piece); r >= 0) {  // tiktoken: whole piece is a token
    out.push_back(r);
    return;
  }
  if (algo == MergeAlgo::kAuto) algo = piece.size() <= 128 ? MergeAlgo::kLinear : MergeAlgo::kHeap;
  if (algo == MergeAlgo::kLinear)
    merge_linear(piece, out);
  else
    merge_heap(piece, out);
}

// tiktoken's algorithm: parts[i] = (start offset, rank of merging part i with part i+1).
// Each step scans for the minimum rank (first one wins ties), merges, and refreshes the two
// affected pair ranks. O(n^2) worst case but tiny constants for typical pieces.
void TiktokenBpe::merge_linear(std::string_view piece, std::vector<int32_t>& out) const {
  struct Part {
    uint32_t start;
    uint32_t rank;
  };
  const size_t n = piece.size();
  std::vector<Part> parts(n + 1);
  auto pair_rank = [&](size_t i) -> uint32_t {  // rank of parts[i] ++ parts[i+1]
    if (i + 2 >= parts.size()) return kNoRank;
    const int32_t r = lookup(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
    return r < 0 ? kNoRank : static_cast<uint32_t>(r);
  };
  for (size_t i = 0; i <= n; ++i) parts[i] = Part{static_cast<uint32_t>(i), kNoRank};
  for (size_t i = 0; i + 1 < n; ++i) parts[i].rank = pair_rank(i);
  while (parts.size() > 2) {
    uint32_t best = kNoRank;
    size_t bi = 0;
    for (size_t i = 0; i + 2 < parts.size(); ++i)
      if (parts[i].rank < best) {
        best = parts[i].rank;
        bi = i;
      }
    if (best == kNoRank) break;
    parts.erase(parts.begin() + bi + 1);
    parts[bi].rank = pair_rank(bi);
    if (bi > 0) parts[bi - 1].rank = pair_rank(bi - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string_view tok = piece.substr(parts[i].start, parts[i + 1].start - parts[i].start);
    out.push_back(tok.size() == 1 ? byte_rank(static_cast<uint8_t>(tok[0])) : lookup(tok));
  }
}

// Same merge order with a min-heap of (rank, start) over a linked list of parts. Stale heap
// entries are skipped by checking them against the part's current pair rank. Ordering by start
// offset breaks ties leftmost, exactly like the linear scan.
void TiktokenBpe::merge_heap(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  std::vector<uint32_t> next(n), prev(n), rank(n, kNoRank);  // indexed by part start offset
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? n : i - 1);  // n = none
  }
  auto end_of = [&](uint32_t i) { return i < n ? next[i] : n; };
  auto pair_rank = [&](uint32_t i) -> uint32_t {
    const uint32_t j = next[i];
    if (j >= n) return kNoRank;
    const int32_t r = lookup(piece.substr(i, end_of(j) - i));
    return r < 0 ? kNoRank : static_cast<uint32_t>(r);
  };
  using Entry = std::pair<uint32_t, uint32_t>;  // (rank, start)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t i = 0; i + 1 < n; ++i) {
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.emplace(rank[i], i);
  }
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || rank[i] != r) continue;  // stale
    const uint32_t j = next[i];                // merge part j into part i
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.emplace(rank[i], i);
    if (prev[i] < n) {
      const uint32_t p = prev[i];
      rank[p] = pair_rank(p);
      if (rank[p] != kNoRank) heap.emplace(rank[p], p);
    }
  }
  for (uint32_t i = 0; i < n; i = next[i]) {
    const std::string_view tok = piece.substr(i, next[i] - i);
    out.push_back(tok.size() == 1 ? byte_rank(static_cast<uint8_t>(tok[0])) : lookup(tok));
  }
}

}  // namespace k3::text
