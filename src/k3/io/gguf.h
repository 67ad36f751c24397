// GGUF container (llama.cpp's model file, version 2 and 3): the header, the metadata key/value pairs and
// the tensor directory, validated, over a byte span or a memory-mapped file. Tensor data is never copied.
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; metadata as
// (string key, u32 type, value), strings as u64 length + bytes, arrays as u32 element type + u64 count +
// elements; tensor infos as (string name, u32 n_dims, u64 dims[n_dims] (innermost first), u32 ggml type,
// u64 offset); then padding to `general.alignment` (default 32) and the data section, each tensor at its
// offset (a multiple of the alignment). First step of issue 15 (GGUF loading): the container only; which
// tensors and keys make a kimi-k3 / kimi-linear model is the loader's job.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3/core/weight_format.h"
#include "k3/io/mapped_file.h"

namespace k3 {

// ggml's tensor types that GGUF files carry: block of `block` elements stored in `bytes` bytes.
struct GgmlTypeInfo {
  const char* name;
  int64_t block, bytes;
};
// Nullopt for a number that is no (longer a) GGUF tensor type.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type);
// The block WeightFormat a ggml type is stored as (Q8_0, the K-quants, IQ4_XS, the codebook i-quants,
// MXFP4 -> MXFP4_GGML); nullopt for float types and types k3 has no format for. And the reverse.
std::optional<WeightFormat> block_format_of_ggml_type(uint32_t type);
std::optional<uint32_t> ggml_type_of_block_format(WeightFormat f);

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // as stored: dims[0] is the innermost (contiguous) one
  uint32_t type = 0;          // ggml type (ggml_type_info)
  uint64_t offset = 0;        // from the start of the data section
  uint64_t bytes = 0;         // of its data
  const uint8_t* data = nullptr;
  int64_t elements() const;
};

struct Gguf {
  uint32_t version = 0;
  uint64_t alignment = 32;
  // Metadata: key -> value (integers, floats, bools, strings, arrays of them as JSON arrays); the GGUF type of
  // each value in `metadata_types` (0 UINT8 .. 12 FLOAT64; arrays: 9).
  nlohmann::json metadata = nlohmann::json::object();
  nlohmann::json metadata_types = nlohmann::json::object();
  std::vector<GgufTensor> tensors;
  uint64_t data_offset = 0;  // where the data section starts in the file

  const GgufTensor* find(const std::string& name) const;
};

// Parses and validates `bytes` (a whole file); `source` names it in errors. Throws k3::Error for anything
// malformed: bad magic / version, truncation, counts or lengths past the end, unknown value or tensor types,
// nested arrays deeper than 2, duplicate keys or tensor names, dims <= 0 or more than 4, element counts that
// overflow or are not whole blocks, misaligned or out-of-file tensor data, a bad `general.alignment`.
Gguf parse_gguf(std::span<const uint8_t> bytes, const std::string& source);

// A mapped GGUF file: the parsed header with tensor data pointing into the mapping.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // throws k3::Error
  const Gguf& gguf() const { return g_; }
  const std::string& path() const { return file_->path(); }
  const MappedFile& mapping() const { return *file_; }

 private:
  std::unique_ptr<MappedFile> file_;
  Gguf g_;
};

}  // namespace k3
