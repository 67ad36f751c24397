// llama.cpp's KL-divergence base file (k3 perplexity --kl-divergence-base FILE --kl-divergence, read when the
// file starts with _logits_): any bytes either parse into a header whose tokens and rows lie inside the
// image, or throw k3::Error.
#include "k3/core/error.h"
#include "k3/eval/llama_kl_base.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const k3::eval::LlamaKlBaseHeader h = k3::eval::parse_llama_kl_base(data, size);
    volatile uint8_t first = data[h.tokens_offset];  // in bounds: the parser checked the size (ASan)
    volatile uint8_t last = data[h.rows_offset + static_cast<size_t>(h.n_chunk * h.rows_per_chunk() * h.row_u16()) * 2 - 1];
    (void)first;
    (void)last;
  } catch (const k3::Error&) {
  }
  return 0;
}
