#include "k3/io/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "k3/core/error.h"
#include "k3/io/gguf.h"

namespace k3 {

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20))
    throw Error("GGUF writer: alignment " + std::to_string(alignment) + " is not a power of two up to 2^20");
  if (alignment != 32) set_u32("general.alignment", alignment);
}

void GgufWriter::str(const std::string& s) {
  pod<uint64_t>(s.size());
  kv_.insert(kv_.end(), s.begin(), s.end());
}

void GgufWriter::key(const std::string& k, GgufType t) {
  for (const std::string& e : keys_)
    if (e == k) throw Error("GGUF writer: metadata key '" + k + "' set twice");
  keys_.push_back(k);
  str(k);
  pod<uint32_t>(static_cast<uint32_t>(t));
  ++n_kv_;
}

void GgufWriter::set_u8(const std::string& k, uint8_t v) { key(k, GgufType::U8), pod(v); }
void GgufWriter::set_i8(const std::string& k, int8_t v) { key(k, GgufType::I8), pod(v); }
void GgufWriter::set_u16(const std::string& k, uint16_t v) { key(k, GgufType::U16), pod(v); }
void GgufWriter::set_i16(const std::string& k, int16_t v) { key(k, GgufType::I16), pod(v); }
void GgufWriter::set_u32(const std::string& k, uint32_t v) { key(k, GgufType::U32), pod(v); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { key(k, GgufType::I32), pod(v); }
void GgufWriter::set_f32(const std::string& k, float v) { key(k, GgufType::F32), pod(v); }
void GgufWriter::set_bool(const std::string& k, bool v) { key(k, GgufType::Bool), pod<uint8_t>(v ? 1 : 0); }
void GgufWriter::set_string(const std::string& k, const std::string& v) { key(k, GgufType::String), str(v); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) { key(k, GgufType::U64), pod(v); }
void GgufWriter::set_i64(const std::string& k, int64_t v) { key(k, GgufType::I64), pod(v); }
void GgufWriter::set_f64(const std::string& k, double v) { key(k, GgufType::F64), pod(v); }

void GgufWriter::array_header(const std::string& k, GgufType elem, uint64_t n) {
  key(k, GgufType::Array);
  pod<uint32_t>(static_cast<uint32_t>(elem));
  pod<uint64_t>(n);
}

void GgufWriter::set_array(const std::string& k, GgufType elem, const std::vector<double>& v) {
  if (elem == GgufType::String || elem == GgufType::Array)
    throw Error("GGUF writer: '" + k + "': set_array takes numbers and bools");
  array_header(k, elem, v.size());
  for (double x : v) {
    switch (elem) {
      case GgufType::U8: pod(static_cast<uint8_t>(x)); break;
      case GgufType::I8: pod(static_cast<int8_t>(x)); break;
      case GgufType::U16: pod(static_cast<uint16_t>(x)); break;
      case GgufType::I16: pod(static_cast<int16_t>(x)); break;
      case GgufType::U32: pod(static_cast<uint32_t>(x)); break;
      case GgufType::I32: pod(static_cast<int32_t>(x)); break;
      case GgufType::F32: pod(static_cast<float>(x)); break;
      case GgufType::Bool: pod<uint8_t>(x != 0 ? 1 : 0); break;
      case GgufType::U64: pod(static_cast<uint64_t>(x)); break;
      case GgufType::I64: pod(static_cast<int64_t>(x)); break;
      default: pod(x); break;  // F64
    }
  }
}

void GgufWriter::set_array_i64(const std::string& k, GgufType elem, const std::vector<int64_t>& v) {
  if (elem == GgufType::F32 || elem == GgufType::F64 || elem == GgufType::String || elem == GgufType::Array)
    throw Error("GGUF writer: '" + k + "': set_array_i64 takes integer types");
  array_header(k, elem, v.size());
  for (int64_t x : v) {
    switch (elem) {
      case GgufType::U8: pod(static_cast<uint8_t>(x)); break;
      case GgufType::I8: pod(static_cast<int8_t>(x)); break;
      case GgufType::U16: pod(static_cast<uint16_t>(x)); break;
      case GgufType::I16: pod(static_cast<int16_t>(x)); break;
      case GgufType::U32: pod(static_cast<uint32_t>(x)); break;
      case GgufType::I32: pod(static_cast<int32_t>(x)); break;
      case GgufType::Bool: pod<uint8_t>(x != 0 ? 1 : 0); break;
      case GgufType::U64: pod(static_cast<uint64_t>(x)); break;
      default: pod(x); break;  // I64
    }
  }
}

void GgufWriter::set_array_strings(const std::string& k, const std::vector<std::string>& v) {
  array_header(k, GgufType::String, v.size());
  for (const std::string& s : v) str(s);
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> ne, uint32_t ggml_type,
                            std::function<void(GgufSink&)> write) {
  for (const Tensor& t : tensors_)
    if (t.name == name) throw Error("GGUF writer: tensor '" + name + "' added twice");
  const auto info = ggml_type_info(ggml_type);
  if (!info) throw Error("GGUF writer: tensor '" + name + "': unknown ggml type " + std::to_string(ggml_type));
  if (ne.empty() || ne.size() > 4) throw Error("GGUF writer: tensor '" + name + "': 1..4 dimensions");
  int64_t n = 1;
  for (int64_t d : ne) {
    if (d <= 0 || d > (int64_t{1} << 40) / n) throw Error("GGUF writer: tensor '" + name + "': bad dimension");
    n *= d;
  }
  if (ne[0] % info->block) throw Error("GGUF writer: tensor '" + name + "': ne[0] is not whole " + info->name + " blocks");
  const uint64_t bytes = static_cast<uint64_t>(n / info->block * info->bytes);
  tensors_.push_back({name, std::move(ne), ggml_type, bytes, std::move(write)});
  tensor_bytes_ += bytes;
}

namespace {

class FileSink final : public GgufSink {
 public:
  FileSink(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  void write(const void* data, size_t bytes) override {
    if (bytes && std::fwrite(data, 1, bytes, f_) != bytes)
      throw Error("cannot write '" + path_ + "': " + std::strerror(errno));
    written_ += bytes;
  }
  void pad(uint64_t alignment) {
    static const uint8_t zeros[64] = {};
    uint64_t n = (alignment - written_ % alignment) % alignment;
    while (n) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof zeros));
      write(zeros, k);
      n -= k;
    }
  }
  uint64_t written() const { return written_; }

 private:
  std::FILE* f_;
  std::string path_;
  uint64_t written_ = 0;
};

}  // namespace

void GgufWriter::write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress) const {
  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(tmp.c_str(), "wb"), std::fclose);
  if (!f) throw Error("cannot create '" + tmp + "': " + std::strerror(errno));
  std::vector<char> buf(4u << 20);
  std::setvbuf(f.get(), buf.data(), _IOFBF, buf.size());
  FileSink out(f.get(), tmp);
  auto u32 = [&](uint32_t v) { out.write(&v, 4); };
  auto u64 = [&](uint64_t v) { out.write(&v, 8); };
  out.write("GGUF", 4);
  u32(3);
  u64(tensors_.size());
  u64(n_kv_);
  out.write(kv_.data(), kv_.size());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    u64(t.name.size());
    out.write(t.name.data(), t.name.size());
    u32(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) u64(static_cast<uint64_t>(d));
    u32(t.type);
    u64(offset);
    offset += (t.bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  out.pad(alignment_);
  uint64_t done = 0;
  for (const Tensor& t : tensors_) {
    const uint64_t start = out.written();
    t.write(out);
    if (out.written() - start != t.bytes)
      throw Error("GGUF writer: tensor '" + t.name + "' wrote " + std::to_string(out.written() - start) +
                  " bytes, it holds " + std::to_string(t.bytes));
    out.pad(alignment_);
    done += t.bytes;
    if (progress) progress(done, tensor_bytes_);
  }
  if (std::fflush(f.get()) != 0) throw Error("cannot write '" + tmp + "': " + std::strerror(errno));
  f.reset();
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

}  // namespace k3
