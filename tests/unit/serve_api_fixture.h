// The OpenAI API layer's test context: the tiny K3-marker vocabulary (tests/data/tiny-tokenizer), the
// kimi_k3 chat adapter over it, and an ApiContext with a small max_model_len. Shared by the API tests and
// fuzz/fuzz_request.cpp, so it must stay free of gtest (test_util.h only names gtest inside a macro).
#pragma once
#include <memory>

#include "k3/serve/model_chat_adapter.h"
#include "k3/serve/openai_api.h"
#include "test_util.h"

namespace k3test {

struct ApiFixture {
  k3::text::Tokenizer tok = k3::text::Tokenizer::load(source_path("tests/data/tiny-tokenizer"));
  std::unique_ptr<k3::serve::ChatAdapter> chat =
      k3::serve::make_model_chat_adapter("kimi_k3", tok, k3::serve::ModelChatAdapterOptions{768, {770}});
  k3::serve::ApiContext ctx() {
    k3::serve::ApiContext c;
    c.model_name = "tiny";
    c.tok = &tok;
    c.chat = chat.get();
    c.bos = 768;
    c.max_model_len = 512;
    c.vocab_size = 1024;
    return c;
  }
};

// One per test binary: loading the vocabulary once.
inline ApiFixture& api_fixture() {
  static ApiFixture f;
  return f;
}

}  // namespace k3test
