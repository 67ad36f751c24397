// Writes a GGUF file (version 3; the container io/gguf.h reads): metadata of every GGUF value type, a tensor
// directory, tensor data aligned to `general.alignment`. Tensor data is streamed: each tensor is a callback
// that writes its bytes into a sink when its turn comes, so memory stays bounded by the metadata, whatever
// the model's size. Writes to PATH.tmp and renames it into place once complete.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace k3 {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

// Where a tensor's callback writes its bytes (exactly the size it declared).
class GgufSink {
 public:
  virtual ~GgufSink() = default;
  virtual void write(const void* data, size_t bytes) = 0;
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);  // a power of two; written as general.alignment when not 32

  // Metadata, in call order. Throws k3::Error for a key given twice.
  void set_u8(const std::string& key, uint8_t v);
  void set_i8(const std::string& key, int8_t v);
  void set_u16(const std::string& key, uint16_t v);
  void set_i16(const std::string& key, int16_t v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_u64(const std::string& key, uint64_t v);
  void set_i64(const std::string& key, int64_t v);
  void set_f64(const std::string& key, double v);
  // Arrays of one element type: integers and floats (any numeric GgufType; values converted), bools, strings.
  void set_array(const std::string& key, GgufType elem, const std::vector<double>& v);
  void set_array_i64(const std::string& key, GgufType elem, const std::vector<int64_t>& v);
  void set_array_strings(const std::string& key, const std::vector<std::string>& v);

  // A tensor: `ne` as ggml orders dimensions (ne[0] innermost), ggml type, and the callback that writes its
  // bytes. Throws k3::Error for a duplicate name, 0 or more than 4 dimensions, an unknown type or an element
  // count that is not whole blocks of it.
  void add_tensor(const std::string& name, std::vector<int64_t> ne, uint32_t ggml_type,
                  std::function<void(GgufSink&)> write);

  // Writes everything to `path`; `progress(done_bytes, total_bytes)` after each tensor. Throws k3::Error on
  // an I/O error or a callback that wrote another number of bytes than its tensor holds.
  void write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress = {}) const;

  uint64_t tensor_bytes() const { return tensor_bytes_; }
  // Tensors added so far: (ggml type, bytes) each, in order (size summaries).
  std::vector<std::pair<uint32_t, uint64_t>> tensor_types() const {
    std::vector<std::pair<uint32_t, uint64_t>> v;
    for (const Tensor& t : tensors_) v.emplace_back(t.type, t.bytes);
    return v;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    uint64_t bytes;
    std::function<void(GgufSink&)> write;
  };
  void key(const std::string& k, GgufType t);
  template <class T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), p, p + sizeof(T));
  }
  void str(const std::string& s);
  void array_header(const std::string& k, GgufType elem, uint64_t n);

  uint32_t alignment_;
  std::vector<uint8_t> kv_;  // serialised metadata
  uint64_t n_kv_ = 0;
  std::vector<std::string> keys_;
  std::vector<Tensor> tensors_;
  uint64_t tensor_bytes_ = 0;
};

}  // namespace k3
