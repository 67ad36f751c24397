// A GGUF as a model (model/gguf_model.h): any bytes either parse, give a config from their metadata, adapt
// their tensors to HF names and bind (model/weights.h), or throw k3::Error; never a crash or an unbounded
// allocation (every rebuilt tensor is sized by tensors present in the input).
#include <span>

#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/model/gguf_model.h"
#include "k3/model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const k3::Gguf g = k3::parse_gguf(std::span<const uint8_t>(data, size), "fuzz");
    const k3::ModelConfig c = k3::gguf_model_config(g, "fuzz");
    std::vector<std::vector<uint8_t>> keep;
    std::vector<k3::TensorInfo> tensors = k3::gguf_tensors_as_hf(c, g, "fuzz", keep);
    const k3::Checkpoint ck("fuzz", std::move(tensors), {}, nullptr, {});
    const k3::ModelWeights w = k3::bind_weights(c, ck);
    (void)w;
  } catch (const k3::Error&) {
  }
  return 0;
}
