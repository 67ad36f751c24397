// The grammar engine of a build without K3_GRAMMAR: structured outputs are refused (400), never ignored.
#include "k3/grammar/grammar_engine.h"

namespace k3::grammar {

struct GrammarEngine::Impl {};

GrammarEngine::GrammarEngine(const text::Tokenizer&, int64_t vocab_size, GrammarEngineOptions)
    : vocab_size_(vocab_size) {}
GrammarEngine::~GrammarEngine() = default;

std::shared_ptr<const CompiledGrammar> GrammarEngine::compile(const GrammarSpec&) const {
  throw GrammarError("structured outputs are not available: this k3 was built with -DK3_GRAMMAR=OFF");
}

bool GrammarEngine::available() { return false; }

}  // namespace k3::grammar
