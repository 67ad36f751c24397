#include "k3/io/gguf.h"

#include <cstring>
#include <limits>
#include <set>

#include "k3/core/error.h"

namespace k3 {

namespace {

// Limits that no real file reaches (K3's GGUF: ~2,600 tensors, ~60 keys, a 163,840-entry vocabulary
// array) and that keep a hostile header from asking for unbounded work before the first read fails.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKeys = 1u << 16;
constexpr uint64_t kMaxStringBytes = 1u << 26;
constexpr int kMaxArrayDepth = 2;
// Array elements over the whole file: each becomes a JSON value (~16+ bytes for a 1-byte u8), so a
// 64 MB array of u8 would cost ~1 GB; real files hold < 1 M (K3's vocabulary, merges and token types).
constexpr uint64_t kMaxArrayElements = 1u << 24;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9,
  kU64 = 10, kI64 = 11, kF64 = 12,
};

// Bounds-checked little-endian reader over the file's bytes.
class Reader {
 public:
  Reader(std::span<const uint8_t> b, const std::string& source) : b_(b), source_(source) {}
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    if (n > kMaxStringBytes) fail(std::string(what) + ": string of " + std::to_string(n) + " bytes");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }
  void need(uint64_t n, const char* what) const {
    if (n > b_.size() - pos_)
      fail(std::string(what) + ": needs " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
           ", the file has " + std::to_string(b_.size()));
  }
  [[noreturn]] void fail(const std::string& why) const { throw Error(source_ + ": not a valid GGUF file: " + why); }
  uint64_t pos() const { return pos_; }
  // Counts array elements against kMaxArrayElements.
  void take_elements(uint64_t n, const std::string& key) {
    if (n > kMaxArrayElements - elements_)
      fail("key '" + key + "': more than " + std::to_string(kMaxArrayElements) + " array elements in the file");
    elements_ += n;
  }
  uint64_t size() const { return b_.size(); }

 private:
  std::span<const uint8_t> b_;
  const std::string& source_;
  uint64_t pos_ = 0;
  uint64_t elements_ = 0;
};

uint64_t scalar_bytes(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}

nlohmann::json read_value(Reader& r, uint32_t type, int depth, const std::string& key) {
  const char* what = "metadata value";
  switch (type) {
    case kU8: return r.get<uint8_t>(what);
    case kI8: return r.get<int8_t>(what);
    case kU16: return r.get<uint16_t>(what);
    case kI16: return r.get<int16_t>(what);
    case kU32: return r.get<uint32_t>(what);
    case kI32: return r.get<int32_t>(what);
    case kF32: return r.get<float>(what);
    case kU64: return r.get<uint64_t>(what);
    case kI64: return r.get<int64_t>(what);
    case kF64: return r.get<double>(what);
    case kBool: {
      const uint8_t v = r.get<uint8_t>(what);
      if (v > 1) r.fail("key '" + key + "': bool value " + std::to_string(v));
      return v == 1;
    }
    case kString: return r.string(what);
    case kArray: {
      if (depth >= kMaxArrayDepth) r.fail("key '" + key + "': arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      const uint32_t et = r.get<uint32_t>("array element type");
      const uint64_t n = r.get<uint64_t>("array length");
      // Each element takes at least one byte (a string at least its 8-byte length): a count the rest of
      // the file cannot hold fails before any allocation.
      const uint64_t min_each = et == kString ? 8 : et == kArray ? 12 : scalar_bytes(et);
      if (min_each == 0) r.fail("key '" + key + "': unknown array element type " + std::to_string(et));
      if (n > (r.size() - r.pos()) / min_each) r.fail("key '" + key + "': array of " + std::to_string(n) + " elements past the end of the file");
      r.take_elements(n, key);
      nlohmann::json a = nlohmann::json::array();
      for (uint64_t i = 0; i < n; ++i) a.push_back(read_value(r, et, depth + 1, key));
      return a;
    }
    default: r.fail("key '" + key + "': unknown value type " + std::to_string(type));
  }
}

uint64_t tensor_bytes(Reader& r, const GgufTensor& t) {
  const auto info = ggml_type_info(t.type);
  if (!info) r.fail("tensor '" + t.name + "': unknown ggml type " + std::to_string(t.type));
  if (t.dims[0] % info->block != 0)
    r.fail("tensor '" + t.name + "': innermost dimension " + std::to_string(t.dims[0]) + " is not a multiple of " +
           info->name + "'s block of " + std::to_string(info->block));
  const uint64_t n = static_cast<uint64_t>(t.elements());
  const uint64_t blocks = n / static_cast<uint64_t>(info->block);
  if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(info->bytes)) r.fail("tensor '" + t.name + "': size overflows");
  return blocks * static_cast<uint64_t>(info->bytes);
}

GgufTensor read_tensor_info(Reader& r) {
  GgufTensor t;
  t.name = r.string("tensor name");
  const uint32_t nd = r.get<uint32_t>("tensor n_dims");
  if (nd == 0 || nd > kMaxDims) r.fail("tensor '" + t.name + "': " + std::to_string(nd) + " dimensions (1..4)");
  int64_t elements = 1;
  for (uint32_t d = 0; d < nd; ++d) {
    const uint64_t v = r.get<uint64_t>("tensor dimension");
    if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        static_cast<int64_t>(v) > std::numeric_limits<int64_t>::max() / elements)
      r.fail("tensor '" + t.name + "': dimension " + std::to_string(v) + " is zero or overflows the element count");
    elements *= static_cast<int64_t>(v);
    t.dims.push_back(static_cast<int64_t>(v));
  }
  t.type = r.get<uint32_t>("tensor type");
  t.offset = r.get<uint64_t>("tensor offset");
  t.bytes = tensor_bytes(r, t);
  return t;
}

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type) {
  // ggml.h's numbering (removed types absent); block sizes from ggml-common.h's block structs.
  static const GgmlTypeInfo kTypes[] = {
      {"f32", 1, 4},       {"f16", 1, 2},         {"q4_0", 32, 18},     {"q4_1", 32, 20},  {nullptr, 0, 0},
      {nullptr, 0, 0},     {"q5_0", 32, 22},      {"q5_1", 32, 24},     {"q8_0", 32, 34},  {"q8_1", 32, 36},
      {"q2_K", 256, 84},   {"q3_K", 256, 110},    {"q4_K", 256, 144},   {"q5_K", 256, 176}, {"q6_K", 256, 210},
      {"q8_K", 256, 292},  {"iq2_xxs", 256, 66},  {"iq2_xs", 256, 74},  {"iq3_xxs", 256, 98}, {"iq1_s", 256, 50},
      {"iq4_nl", 32, 18},  {"iq3_s", 256, 110},   {"iq2_s", 256, 82},   {"iq4_xs", 256, 136}, {"i8", 1, 1},
      {"i16", 1, 2},       {"i32", 1, 4},         {"i64", 1, 8},        {"f64", 1, 8},     {"iq1_m", 256, 56},
      {"bf16", 1, 2},      {nullptr, 0, 0},       {nullptr, 0, 0},      {nullptr, 0, 0},   {"tq1_0", 256, 54},
      {"tq2_0", 256, 66},  {nullptr, 0, 0},       {nullptr, 0, 0},      {nullptr, 0, 0},   {"mxfp4", 32, 17},
  };
  if (type >= std::size(kTypes) || kTypes[type].name == nullptr) return std::nullopt;
  return kTypes[type];
}

namespace {
constexpr std::pair<uint32_t, WeightFormat> kBlockTypes[] = {
    {8, WeightFormat::Q8_0},     {10, WeightFormat::Q2_K},    {11, WeightFormat::Q3_K},   {12, WeightFormat::Q4_K},
    {13, WeightFormat::Q5_K},    {14, WeightFormat::Q6_K},    {16, WeightFormat::IQ2_XXS}, {17, WeightFormat::IQ2_XS},
    {18, WeightFormat::IQ3_XXS}, {19, WeightFormat::IQ1_S},   {21, WeightFormat::IQ3_S},  {22, WeightFormat::IQ2_S},
    {23, WeightFormat::IQ4_XS},  {2, WeightFormat::Q4_0},    {3, WeightFormat::Q4_1},     {6, WeightFormat::Q5_0},
    {7, WeightFormat::Q5_1},     {20, WeightFormat::IQ4_NL},  {29, WeightFormat::IQ1_M},   {39, WeightFormat::MXFP4_GGML}};
}  // namespace

std::optional<WeightFormat> block_format_of_ggml_type(uint32_t type) {
  for (const auto& [t, f] : kBlockTypes)
    if (t == type) return f;
  return std::nullopt;
}

std::optional<uint32_t> ggml_type_of_block_format(WeightFormat f) {
  for (const auto& [t, g] : kBlockTypes)
    if (g == f) return t;
  return std::nullopt;
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const GgufTensor* Gguf::find(const std::string& name) const {
  for (const GgufTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Gguf parse_gguf(std::span<const uint8_t> bytes, const std::string& source) {
  Reader r(bytes, source);
  Gguf g;
  const uint32_t magic = r.get<uint32_t>("magic");
  if (magic != 0x46554747u) r.fail("magic is not 'GGUF'");
  g.version = r.get<uint32_t>("version");
  if (g.version != 2 && g.version != 3) r.fail("version " + std::to_string(g.version) + " (2 and 3 are supported)");
  const uint64_t n_tensors = r.get<uint64_t>("tensor count"), n_keys = r.get<uint64_t>("metadata count");
  if (n_tensors > kMaxTensors) r.fail(std::to_string(n_tensors) + " tensors");
  if (n_keys > kMaxKeys) r.fail(std::to_string(n_keys) + " metadata keys");
  for (uint64_t i = 0; i < n_keys; ++i) {
    const std::string key = r.string("metadata key");
    if (g.metadata.contains(key)) r.fail("duplicate metadata key '" + key + "'");
    const uint32_t type = r.get<uint32_t>("metadata value type");
    g.metadata[key] = read_value(r, type, 0, key);
    g.metadata_types[key] = type;
  }
  if (g.metadata.contains("general.alignment")) {
    const auto& a = g.metadata["general.alignment"];
    if (g.metadata_types["general.alignment"] != kU32 || a.get<uint64_t>() == 0 || (a.get<uint64_t>() & (a.get<uint64_t>() - 1)))
      r.fail("general.alignment must be a u32 power of two");
    g.alignment = a.get<uint64_t>();
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t = read_tensor_info(r);
    if (!names.insert(t.name).second) r.fail("duplicate tensor '" + t.name + "'");
    g.tensors.push_back(std::move(t));
  }
  g.data_offset = (r.pos() + g.alignment - 1) / g.alignment * g.alignment;
  const uint64_t data_size = g.data_offset <= bytes.size() ? bytes.size() - g.data_offset : 0;
  for (GgufTensor& t : g.tensors) {
    if (t.offset % g.alignment) r.fail("tensor '" + t.name + "': offset " + std::to_string(t.offset) + " is not aligned");
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      r.fail("tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
             ") past the end of the data section (" + std::to_string(data_size) + " bytes)");
    t.data = bytes.data() + g.data_offset + t.offset;
  }
  return g;
}

GgufFile::GgufFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
  g_ = parse_gguf(std::span<const uint8_t>(file_->data(), file_->size()), path);
}

}  // namespace k3
