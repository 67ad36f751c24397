// config.json parser: any bytes either parse into a validated ModelConfig or throw k3::Error.
#include <string>

#include "k3/core/error.h"
#include "k3/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    k3::ModelConfig c = k3::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)c;
  } catch (const k3::Error&) {
  }
  return 0;
}
