// What the engine sees of a grammar (structured outputs): a compiled grammar shared by requests, and one
// matcher per sequence saying which token ids may come next. No grammar library here: the engine and its
// tests depend on these two interfaces only (grammar_engine.h builds them with xgrammar).
#pragma once
#include <cstdint>
#include <memory>
#include <span>

namespace k3::grammar {

// One sequence's position in its grammar. Not thread-safe (one sequence, the engine thread).
class TokenMatcher {
 public:
  virtual ~TokenMatcher() = default;
  // The ids allowed next, as a bitmask of ceil(vocab / 32) words: bit (i % 32) of words[i / 32] set
  // <=> id i may come next. Once the grammar is complete, only its stop tokens are allowed.
  virtual void fill_allowed(std::span<uint32_t> words) = 0;
  // Advances over `token`; false (state unchanged) when the grammar does not allow it.
  virtual bool accept(int32_t token) = 0;
  // A stop token was accepted after the grammar completed: nothing more may come.
  virtual bool terminated() const = 0;
};

// A grammar compiled for one model's vocabulary; immutable, shared by every request that uses it.
class CompiledGrammar {
 public:
  virtual ~CompiledGrammar() = default;
  virtual std::unique_ptr<TokenMatcher> new_matcher() const = 0;
  // The mask's length in 32-bit words (ceil(model vocab / 32)).
  virtual int64_t mask_words() const = 0;
};

}  // namespace k3::grammar
