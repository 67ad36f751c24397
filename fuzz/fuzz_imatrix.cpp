// Importance-matrix GGUF (k3 imatrix / llama-imatrix files, model/imatrix.h): any bytes either parse into
// entries whose sums and counts are finite and non-negative, or throw k3::Error.
#include <cmath>
#include <span>

#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/model/imatrix.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const k3::Gguf g = k3::parse_gguf(std::span<const uint8_t>(data, size), "fuzz");
    const k3::Imatrix im = k3::parse_imatrix(g, "fuzz");
    for (const auto& [name, e] : im.entries) {
      if (e.in_sum2.size() != static_cast<size_t>(e.cols) * e.counts.size()) __builtin_trap();
      for (int64_t m = 0; m < static_cast<int64_t>(e.counts.size()); ++m) (void)im.importance(name, m, e.cols);
    }
  } catch (const k3::Error&) {
  }
  return 0;
}
