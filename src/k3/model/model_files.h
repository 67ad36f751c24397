// Where a model's config and tensors come from: an HF checkpoint directory (config.json + safetensors) or a
// GGUF file (model/gguf_model.h). The runners (CPU Model, CudaModel) load through this one function.
#pragma once
#include <memory>
#include <string>

#include "k3/io/safetensors.h"
#include "k3/model/config.h"

namespace k3 {

struct ModelFiles {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  bool gguf = false;
  std::string name;  // a GGUF's general.name ("" for an HF directory or a GGUF without one)
};

// `path`: a directory (HF) or a GGUF file. Throws k3::Error for anything else or anything malformed.
ModelFiles open_model_files(const std::string& path);

}  // namespace k3
