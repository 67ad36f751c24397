// The tokenizer metadata llama.cpp's converter writes for Kimi models (tokenizer.ggml.*: model "gpt2", pre
// "kimi-k2", tokens in GPT-2's byte-to-unicode spelling with the BPE ranks as ids, merges recovered from the
// ranks, token types, BOS flag), from k3's tiktoken tokenizer.
#pragma once
#include <cstdint>

#include "k3/io/gguf_writer.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

// `vocab_size`: the model's; ids the tokenizer lacks become "[PAD<id>]" UNUSED entries, as the converter does.
void add_tokenizer_to_gguf(k3::GgufWriter& w, const k3::text::Tokenizer& tok, int64_t vocab_size, bool add_bos);

}  // namespace k3cli
