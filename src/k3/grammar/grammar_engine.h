// The grammar engine of structured outputs: request grammars (JSON schema, regex, EBNF/GBNF, xgrammar
// structural tags) compiled against one model's vocabulary, through xgrammar's C++ core
// (cmake/xgrammar.cmake; docs/serving.md "Structured outputs"). Built without K3_GRAMMAR, every compile
// throws GrammarError saying so.
//
// The vocabulary handed over: every ordinary token as its raw bytes; every special token (control
// markers, end-of-turn, reserved slots) as the byte 0xFF + its name. No UTF-8 text starts with 0xFF, so no
// text element of any grammar (JSON string, regex, literal, character class) can take a special token: a
// grammar names the markers it wants by token id (structural tags' `token`, EBNF `Token(id)`), free text
// excludes them by id, and the stop ids are allowed only once the grammar is complete. (xgrammar's own
// "special" tokens -- an empty string -- can never be accepted at all, not even by id.) Ids past the
// tokenizer (a padded model vocabulary) are never allowed.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "k3/grammar/token_matcher.h"
#include "k3/text/tokenizer.h"

namespace k3::grammar {

// A grammar the client sent that cannot be used (syntax, unsatisfiable schema, too large, too slow to
// compile): the server answers 400 naming the request field.
struct GrammarError : std::runtime_error {
  explicit GrammarError(const std::string& m) : std::runtime_error(m) {}
};
// Too many grammars are compiling at once: the server answers 503 + Retry-After.
struct GrammarBusy : std::runtime_error {
  explicit GrammarBusy(const std::string& m) : std::runtime_error(m) {}
};

struct GrammarSpec {
  enum class Kind {
    JsonObject,     // any JSON object (response_format json_object)
    JsonSchema,     // source: the schema as JSON text
    Regex,          // source: the pattern
    Ebnf,           // source: EBNF / GBNF text, root rule "root"
    StructuralTag,  // source: xgrammar's structural tag JSON ({"type": "structural_tag", "format": ...})
  };
  Kind kind = Kind::JsonObject;
  std::string source;
  std::vector<int32_t> stop_ids;  // what may end the output once the grammar is complete (EOS, end of turn)
};

struct GrammarEngineOptions {
  int64_t cache_bytes = int64_t{256} << 20;    // compiled grammars kept (by their source text), LRU-bounded
  int64_t max_source_bytes = int64_t{256} << 10;  // larger schemas / grammars -> GrammarError
  double compile_timeout_s = 10.0;             // a compile taking longer -> GrammarError (it runs on)
  int max_compiling = 4;                       // compiles at once (timed-out ones included); beyond: GrammarBusy
  int compile_threads = 2;                     // xgrammar's own pool, per compile
};

class GrammarEngine {
 public:
  // `vocab_size`: the model's (>= tok.n_vocab(); the padding ids are special).
  GrammarEngine(const text::Tokenizer& tok, int64_t vocab_size, GrammarEngineOptions opt = {});
  ~GrammarEngine();
  GrammarEngine(const GrammarEngine&) = delete;
  GrammarEngine& operator=(const GrammarEngine&) = delete;

  // Thread-safe. Compiles on a thread of its own and waits at most compile_timeout_s. Throws GrammarError
  // (invalid / too large / too slow) or GrammarBusy.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec) const;
  int64_t vocab_size() const { return vocab_size_; }
  static bool available();  // built with K3_GRAMMAR

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with compiles that outlive a timeout
  int64_t vocab_size_ = 0;
};

}  // namespace k3::grammar
