// KL-divergence base file (k3 perplexity --kl-divergence-base): any bytes either parse into a header whose
// ids and rows lie inside the image, or throw k3::Error.
#include "k3/core/error.h"
#include "k3/eval/kl_divergence.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const k3::eval::KlBaseHeader h = k3::eval::parse_kl_base(data, size);
    volatile uint8_t first_id = data[h.ids_offset];  // in bounds: the parser checked the size (ASan)
    volatile uint8_t last = data[h.rows_offset + static_cast<size_t>(h.n_rows * h.n_vocab) * 4 - 1];
    (void)first_id;
    (void)last;
  } catch (const k3::Error&) {
  }
  return 0;
}
