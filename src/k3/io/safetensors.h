// Safetensors checkpoints: a single `model.safetensors` or shards listed by
// `model.safetensors.index.json`, memory-mapped. Tensor data is never copied here.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3/core/dtype.h"
#include "k3/core/weight_format.h"
#include "k3/io/mapped_file.h"

namespace k3 {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapped file
  size_t nbytes = 0;
  std::string file;  // which shard holds it (for error messages)
  // Set for a matrix stored in a block format with in-block scales (a GGUF's Q8_0, Q4_K, ...): then dtype is
  // U8 and shape [rows, row_data_bytes(format, cols)]; the binder takes it where it expects a float matrix.
  std::optional<WeightFormat> block_format;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::string shape_str() const;
};

class SafetensorsFile {
 public:
  // Parses and validates the header (offsets in bounds, sizes consistent with dtype x shape,
  // no overlaps). Throws k3::Error naming the file and tensor.
  explicit SafetensorsFile(const std::string& path);
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }
  const MappedFile& mapping() const { return file_; }

 private:
  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a checkpoint directory, across shards.
class Checkpoint {
 public:
  // dir holds model.safetensors.index.json (sharded) or model.safetensors (or any *.safetensors).
  explicit Checkpoint(const std::string& dir);
  // Tensors another reader found, under the names the model binder looks up (a GGUF seen under its HF names:
  // model/gguf_model.h). Their data lives in `maps` or in `owner` (converted copies), both kept alive here;
  // `note` adds to a tensor name in messages what it is in the file (" (GGUF 'blk.0.attn_q.weight')").
  Checkpoint(std::string label, std::vector<TensorInfo> tensors, std::vector<const MappedFile*> maps,
             std::shared_ptr<const void> owner, std::function<std::string(const std::string&)> note);
  // " (what `name` is in the file)" for adapted checkpoints, else "".
  std::string name_note(const std::string& name) const { return note_ ? note_(name) : std::string(); }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, const TensorInfo*>& all() const { return index_; }
  const std::string& dir() const { return dir_; }
  size_t total_bytes() const;
  // The shards' mappings (for residency hints over byte ranges: runtime/expert_residency.h).
  std::vector<const MappedFile*> mappings() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::vector<TensorInfo> adapted_;      // the tensors of an adapted checkpoint (index_ points here)
  std::vector<const MappedFile*> adapted_maps_;
  std::shared_ptr<const void> owner_;
  std::function<std::string(const std::string&)> note_;
};

}  // namespace k3
