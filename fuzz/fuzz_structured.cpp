// Structured-output fields through the request parser with a real grammar engine: any bytes as a request
// body (seeds: response_format / structured_outputs / guided_* / grammar / strict tools with schemas, regexes
// and EBNF) either become a request -- whose compiled grammar then runs a matcher over a few tokens -- or
// throw ApiError 400 (503: too many compiles at once). Never another exception, a crash or a hang: the
// schema / grammar text reaches our field parser, the structural-tag builder and xgrammar's parsers.
#include <cstdint>
#include <string_view>
#include <vector>

#include "k3/grammar/grammar_engine.h"
#include "serve_api_fixture.h"  // tests/unit: the API tests' tokenizer, chat adapter and context (no gtest)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const k3::grammar::GrammarEngine engine = [] {
    k3::grammar::GrammarEngineOptions o;
    o.compile_timeout_s = 2.0;     // a mutation that explodes costs two seconds, not the run
    o.max_source_bytes = 16 << 10;
    return k3::grammar::GrammarEngine(k3test::api_fixture().tok, 1024, o);
  }();
  static const k3::serve::ApiContext api = [] {
    k3::serve::ApiContext c = k3test::api_fixture().ctx();
    c.max_model_len = 4096;
    c.grammar = &engine;
    return c;
  }();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto ep : {k3::serve::Endpoint::Chat, k3::serve::Endpoint::Completions}) {
    try {
      const nlohmann::json j = k3::serve::parse_json_body(body);
      const k3::serve::GenRequest r = k3::serve::parse_generation_request(ep, j, api);
      if (!r.grammar) continue;
      // The matcher walks the first allowed token a few times: its mask and accept agree.
      auto m = r.grammar->new_matcher();
      std::vector<uint32_t> mask(static_cast<size_t>(r.grammar->mask_words()));
      for (int step = 0; step < 16 && !m->terminated(); ++step) {
        m->fill_allowed(mask);
        int32_t next = -1;
        for (size_t w = 0; w < mask.size() && next < 0; ++w)
          if (mask[w]) next = static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(mask[w])));
        if (next < 0) break;
        if (!m->accept(next)) __builtin_trap();
      }
    } catch (const k3::serve::ApiError& e) {
      if (e.status != 503 && (e.status < 400 || e.status > 499)) __builtin_trap();
    }
  }
  return 0;
}
