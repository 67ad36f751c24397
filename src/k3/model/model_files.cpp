#include "k3/model/model_files.h"

#include <filesystem>

#include "k3/core/error.h"
#include "k3/model/gguf_model.h"

namespace k3 {

ModelFiles open_model_files(const std::string& path) {
  ModelFiles f;
  if (is_gguf_path(path)) {
    GgufModel g = open_gguf_model(path);
    f.config = std::move(g.config);
    f.checkpoint = std::move(g.checkpoint);
    f.gguf = true;
    f.name = std::move(g.name);
    return f;
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec))
    throw Error("'" + path + "' is neither an HF checkpoint directory nor a GGUF file (no GGUF magic)");
  f.config = load_model_config(path);
  f.checkpoint = std::make_unique<Checkpoint>(path);
  return f;
}

}  // namespace k3
