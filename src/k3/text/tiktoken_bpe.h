// tiktoken-style byte-level BPE: a table of token bytes -> rank, loaded from a `tiktoken.model`
// file (`base64(token_bytes) rank` per line), and the rank-ordered merge that tiktoken runs on
// each pre-tokenised piece.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3/core/error.h"

namespace k3::text {

enum class MergeAlgo { kAuto, kLinear, kHeap };

class TiktokenBpe {
 public:
  // Reads a tiktoken.model file; malformed lines throw k3::Error naming the file and line.
  static TiktokenBpe load(const std::string& path);
  // Same, from the file's contents; `origin` names the source in error messages.
  static TiktokenBpe parse(std::string_view contents, const std::string& origin);

  // Number of ranks (lines). Ranks need not be contiguous, but every id below max_rank()+1
  // that has no bytes is a hole that token_bytes() rejects.
  int32_t size() const { return count_; }
  int32_t max_rank() const { return static_cast<int32_t>(bytes_.size()) - 1; }

  std::optional<int32_t> rank(std::string_view bytes) const;
  // Bytes of rank r; nullptr for holes / out of range.
  const std::string* bytes(int32_t r) const;

  // Appends the ranks of `piece` after byte-pair merging exactly like tiktoken: while any
  // adjacent pair's concatenation is a token, merge the pair of lowest rank (leftmost on ties).
  // A piece that is itself a token is emitted directly (tiktoken's shortcut, which matters when
  // merging would not reach it). kAuto picks an O(n^2) scan for short pieces (fast, no
  // allocation) and a heap for long ones (O(n log n), e.g. long whitespace runs).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out,
                    MergeAlgo algo = MergeAlgo::kAuto) const;

 private:
  struct Slot {
    uint32_t hash;
    int32_t rank;  // -1 = empty
  };
  void insert(const std::string& origin, size_t line, std::string bytes, int32_t rank);
  void merge_linear(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_heap(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t lookup(std::string_view bytes) const;  // -1 if absent
  int32_t byte_rank(uint8_t b) const;  // throws if the vocab lacks the byte

  std::vector<std::string> bytes_;  // rank -> bytes
  std::vector<uint8_t> present_;    // rank -> 1 if bytes_[rank] is a token
  std::vector<Slot> table_;         // open addressing, power-of-two size
  int32_t byte_ranks_[256];         // rank of each single byte, -1 if absent
  int32_t count_ = 0;
};

}  // namespace k3::text
