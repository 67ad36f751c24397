// The tokenizer metadata llama.cpp's converter writes for Kimi models (tokenizer.ggml.*: model "gpt2", pre
// "kimi-k2", tokens in GPT-2's byte-to-unicode spelling with the BPE ranks as ids, merges recovered from the
// ranks, token types, BOS flag), from k3's tiktoken tokenizer.
#pragma once
#include <cstdint>

#include "k3/io/gguf.h"
#include "k3/io/gguf_writer.h"
#include "k3/text/tokenizer.h"

namespace k3::text {

// `vocab_size`: the model's; ids the tokenizer lacks become "[PAD<id>]" UNUSED entries, as the converter does.
void add_tokenizer_to_gguf(k3::GgufWriter& w, const Tokenizer& tok, int64_t vocab_size, bool add_bos);

// The inverse: k3's tokenizer from a GGUF's tokenizer.ggml.* arrays when they are a Kimi vocabulary (model
// "gpt2", pre "kimi-k2", NORMAL tokens = the BPE ranks 0..n-1 in byte-level spelling, then the special slots).
// Throws k3::Error naming the key or token otherwise.
Tokenizer tokenizer_from_gguf(const k3::Gguf& g, const std::string& source);

}  // namespace k3::text
