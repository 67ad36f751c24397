// safetensors header parser (SafetensorsFile): any bytes, written to a temp file (the class maps a
// file), either open as a validated tensor table or throw k3::Error. Shapes whose byte count
// overflows, offsets past the end, overlaps and duplicate names are all in reach of the mutator.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "k3/core/error.h"
#include "k3/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/k3_fuzz_safetensors_" + std::to_string(::getpid()) + ".safetensors";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    return 0;
  }
  try {
    const k3::SafetensorsFile file(path);
    for (const auto& [name, t] : file.tensors()) {
      // Everything the header promised must be readable inside the mapping.
      volatile uint8_t sink = 0;
      if (t.nbytes) sink = sink + t.data[0] + t.data[t.nbytes - 1];
      (void)t.numel();
    }
  } catch (const k3::Error&) {
  }
  return 0;
}
