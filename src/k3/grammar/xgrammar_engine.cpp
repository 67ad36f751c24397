// GrammarEngine over xgrammar's C++ core (K3_GRAMMAR). See grammar_engine.h.
#include <xgrammar/xgrammar.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "k3/grammar/grammar_engine.h"

namespace k3::grammar {

namespace {

// 0xFF starts no UTF-8 sequence: text elements of a grammar (JSON strings, regexes, literals, character
// classes) can never match a token whose bytes start with it, whereas `token` elements select it by id.
const std::string kSpecialPrefix = "\xFF";

class XgMatcher final : public TokenMatcher {
 public:
  XgMatcher(const xgrammar::CompiledGrammar& g, const std::vector<int32_t>& stop_ids)
      : m_(g, stop_ids.empty() ? std::nullopt
                               : std::optional<std::vector<int>>(std::vector<int>(stop_ids.begin(), stop_ids.end()))) {}
  void fill_allowed(std::span<uint32_t> words) override {
    int64_t shape = static_cast<int64_t>(words.size());
    DLTensor t{};
    t.data = words.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = &shape;
    m_.FillNextTokenBitmask(&t);
  }
  bool accept(int32_t token) override { return m_.AcceptToken(token); }
  bool terminated() const override { return m_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher m_;
};

class XgCompiled final : public CompiledGrammar {
 public:
  XgCompiled(xgrammar::CompiledGrammar g, std::vector<int32_t> stop_ids, int64_t words)
      : g_(std::move(g)), stop_ids_(std::move(stop_ids)), words_(words) {}
  std::unique_ptr<TokenMatcher> new_matcher() const override { return std::make_unique<XgMatcher>(g_, stop_ids_); }
  int64_t mask_words() const override { return words_; }

 private:
  xgrammar::CompiledGrammar g_;
  std::vector<int32_t> stop_ids_;
  int64_t words_;
};

// Ordinary tokens as their bytes; special ones as 0xFF + their name (see the header); the model's padding
// ids past the tokenizer are xgrammar's own "special" ids, never allowed.
std::vector<std::string> vocab_of(const text::Tokenizer& tok) {
  std::vector<std::string> v(static_cast<size_t>(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    v[static_cast<size_t>(id)] = tok.is_special(id) ? kSpecialPrefix + tok.token_bytes(id) : tok.token_bytes(id);
  return v;
}

}  // namespace

struct GrammarEngine::Impl {
  Impl(const text::Tokenizer& tok, int64_t vocab_size, GrammarEngineOptions o)
      : opt(o),
        info(vocab_of(tok), xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
             std::vector<int32_t>{tok.eos_id() >= 0 ? tok.eos_id() : 0}),
        compiler(info, o.compile_threads, /*cache_enabled=*/true, o.cache_bytes),
        words((vocab_size + 31) / 32) {}

  xgrammar::CompiledGrammar compile_now(const GrammarSpec& s) {
    switch (s.kind) {
      case GrammarSpec::Kind::JsonObject:
        return compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/true, std::nullopt, std::nullopt,
                                          /*strict_mode=*/false, /*max_whitespace_cnt=*/kMaxWhitespace);
      case GrammarSpec::Kind::JsonSchema:
        // strict_mode: no properties beyond the declared ones (OpenAI's strict: additionalProperties false).
        return compiler.CompileJSONSchema(s.source, true, std::nullopt, std::nullopt, /*strict_mode=*/true,
                                          kMaxWhitespace);
      case GrammarSpec::Kind::Regex: return compiler.CompileRegex(s.source);
      case GrammarSpec::Kind::Ebnf: return compiler.CompileGrammar(s.source, "root");
      case GrammarSpec::Kind::StructuralTag: return compiler.CompileStructuralTag(s.source);
    }
    throw GrammarError("unknown grammar kind");
  }

  // Whitespace runs inside JSON are bounded: a weak model could otherwise fill its budget with spaces.
  static constexpr int kMaxWhitespace = 2;
  GrammarEngineOptions opt;
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  int64_t words;
  std::atomic<int> compiling{0};
};

GrammarEngine::GrammarEngine(const text::Tokenizer& tok, int64_t vocab_size, GrammarEngineOptions opt)
    : vocab_size_(vocab_size) {
  if (vocab_size < tok.n_vocab()) vocab_size_ = tok.n_vocab();
  impl_ = std::make_shared<Impl>(tok, vocab_size_, opt);
}
GrammarEngine::~GrammarEngine() = default;

bool GrammarEngine::available() { return true; }

std::shared_ptr<const CompiledGrammar> GrammarEngine::compile(const GrammarSpec& spec) const {
  if (static_cast<int64_t>(spec.source.size()) > impl_->opt.max_source_bytes)
    throw GrammarError("the grammar / schema is " + std::to_string(spec.source.size()) + " bytes, more than the " +
                       std::to_string(impl_->opt.max_source_bytes) + " this server compiles");
  if (impl_->compiling.fetch_add(1) >= impl_->opt.max_compiling) {
    impl_->compiling.fetch_sub(1);
    throw GrammarBusy("too many grammars are being compiled at once; retry shortly");
  }
  // The compile runs on a thread of its own so that a schema that explodes costs its client a timeout,
  // not a parse worker forever; a timed-out compile runs on (counted in `compiling`) and its result is dropped.
  struct Job {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::optional<xgrammar::CompiledGrammar> out;
    std::string error;
  };
  auto job = std::make_shared<Job>();
  std::shared_ptr<Impl> impl = impl_;
  std::thread([impl, job, spec] {
    std::optional<xgrammar::CompiledGrammar> out;
    std::string error;
    try {
      out.emplace(impl->compile_now(spec));
    } catch (const std::exception& e) {  // xgrammar reports bad input by exceptions of several types
      error = e.what();
      if (error.empty()) error = "invalid grammar";
    }
    impl->compiling.fetch_sub(1);
    std::lock_guard lk(job->mu);
    job->out = std::move(out);
    job->error = std::move(error);
    job->done = true;
    job->cv.notify_all();
  }).detach();
  std::unique_lock lk(job->mu);
  const auto limit = std::chrono::duration<double>(impl_->opt.compile_timeout_s);
  if (!job->cv.wait_for(lk, limit, [&] { return job->done; }))
    throw GrammarError("the grammar / schema took longer than " + std::to_string(impl_->opt.compile_timeout_s) +
                       " s to compile; simplify it");
  if (!job->out) {
    std::string e = job->error;
    if (e.size() > 2000) e = e.substr(0, 2000) + "...";
    throw GrammarError(e);
  }
  return std::make_shared<XgCompiled>(std::move(*job->out), spec.stop_ids, impl_->words);
}

}  // namespace k3::grammar
