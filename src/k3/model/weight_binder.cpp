// WeightBinder (weight_binder.h), moved out of weights.cpp so that the block drafter binds its tensors the
// same way.
#include "k3/model/weight_binder.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "k3/core/error.h"
#include "k3/io/page_cache.h"

namespace k3 {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

WeightBinder::WeightBinder(const Checkpoint& ck, std::vector<std::vector<uint8_t>>& copies, const Placement* placement,
                           int model_device)
    : ck_(ck), copies_(copies), placement_(placement), model_device_(model_device) {}

WeightMatrix WeightBinder::mat(const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo* t = get(name, "F32/BF16/F16 " + shape_str({rows, cols}));
  if (!t) return {};
  if (t->block_format) return block_matrix(name, t, *t->block_format, rows, cols);
  if (!is_float_dtype(t->dtype)) return bad(name, t, "dtype " + std::string(dtype_name(t->dtype)) + ", expected F32/BF16/F16");
  if (t->shape != std::vector<int64_t>{rows, cols}) return bad(name, t, "shape " + t->shape_str() + ", expected " + shape_str({rows, cols}));
  WeightMatrix w;
  float_weight_format(t->dtype, &w.format);
  w.data = aligned(t);
  w.rows = rows;
  w.cols = cols;
  w.device = device_for(name);
  bytes_ += static_cast<int64_t>(t->nbytes);
  return w;
}

WeightMatrix WeightBinder::block_matrix(const std::string& name, const TensorInfo* t, WeightFormat f, int64_t rows,
                                       int64_t cols) {
  const int64_t be = weight_layout(f).block_elems;
  if (cols % be != 0)
    return bad(name, t, std::string(weight_format_name(f)) + " with " + std::to_string(cols) + " columns, not a multiple of its " +
                            std::to_string(be) + "-element blocks");
  const std::vector<int64_t> want{rows, row_data_bytes(f, cols)};
  if (t->dtype != DType::U8 || t->shape != want)
    return bad(name, t, std::string(weight_format_name(f)) + " blocks " + t->shape_str() + ", expected " + shape_str(want) +
                            " for " + shape_str({rows, cols}));
  WeightMatrix w;
  w.format = f;
  w.data = t->data;
  w.rows = rows;
  w.cols = cols;
  w.device = device_for(name);
  bytes_ += static_cast<int64_t>(t->nbytes);
  return w;
}

WeightMatrix WeightBinder::packed(const std::string& base, WeightFormat format, int64_t rows, int64_t cols) {
  // A GGUF's stacked experts may mix block formats across gate / up / down (k3 quantize keeps a matrix
  // whose width is not whole blocks of the target type as shipped): the tensor's own format wins.
  if (const TensorInfo* t = ck_.find(base + ".weight"); t && t->block_format) format = *t->block_format;
  const std::vector<int64_t> pshape{rows, row_data_bytes(format, cols)}, sshape{rows, row_scale_bytes(format, cols)};
  if (weight_layout(format).scale_bytes == 0) {
    const TensorInfo* p = get(base + ".weight", std::string(weight_format_name(format)) + " blocks, U8 " + shape_str(pshape));
    if (!p) return {};
    if (p->dtype != DType::U8 || p->shape != pshape)
      return bad(base + ".weight", p, std::string(dtype_name(p->dtype)) + " " + p->shape_str() + ", expected U8 " + shape_str(pshape));
    WeightMatrix w;
    w.format = format;
    w.device = device_for(base + ".weight");
    w.data = p->data;
    w.rows = rows;
    w.cols = cols;
    bytes_ += static_cast<int64_t>(p->nbytes);
    return w;
  }
  const TensorInfo* p = get(base + ".weight_packed", "U8 " + shape_str(pshape));
  const TensorInfo* s = get(base + ".weight_scale", "U8 " + shape_str(sshape));
  if (!p || !s) return {};
  bool ok = true;
  if (p->dtype != DType::U8 || p->shape != pshape) {
    bad(base + ".weight_packed", p, std::string(dtype_name(p->dtype)) + " " + p->shape_str() + ", expected U8 " + shape_str(pshape));
    ok = false;
  }
  if (s->dtype != DType::U8 || s->shape != sshape) {
    bad(base + ".weight_scale", s, std::string(dtype_name(s->dtype)) + " " + s->shape_str() + ", expected U8 " + shape_str(sshape));
    ok = false;
  }
  if (!ok) return {};
  if (format == WeightFormat::MXFP4 && !scales_are_finite(base + ".weight_scale", s, sshape[1])) return {};
  WeightMatrix w;
  w.format = format;
  w.device = device_for(base + ".weight");
  w.data = p->data;
  w.scales = s->data;
  w.rows = rows;
  w.cols = cols;
  bytes_ += static_cast<int64_t>(p->nbytes + s->nbytes);
  return w;
}

void WeightBinder::prefetch(const std::string& name) {
  if (const TensorInfo* t = ck_.find(name)) prefetch_mapped(t->data, t->nbytes);
}

std::vector<float> WeightBinder::vec(const std::string& name, const std::vector<std::vector<int64_t>>& shapes) {
  const TensorInfo* t = get(name, "F32/BF16/F16 " + shape_str(shapes[0]));
  if (!t) return {};
  if (!is_float_dtype(t->dtype)) {
    bad(name, t, "dtype " + std::string(dtype_name(t->dtype)) + ", expected F32/BF16/F16");
    return {};
  }
  bool ok = false;
  for (auto& s : shapes) ok |= (t->shape == s);
  if (!ok) {
    std::string exp;
    for (auto& s : shapes) exp += (exp.empty() ? "" : " or ") + shape_str(s);
    bad(name, t, "shape " + t->shape_str() + ", expected " + exp);
    return {};
  }
  std::vector<float> out(static_cast<size_t>(t->numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t->dtype) {
      case DType::F32: { float f; std::memcpy(&f, t->data + 4 * i, 4); out[i] = f; break; }
      case DType::BF16: { uint16_t h; std::memcpy(&h, t->data + 2 * i, 2); out[i] = bf16_to_f32(h); break; }
      default: { uint16_t h; std::memcpy(&h, t->data + 2 * i, 2); out[i] = f16_to_f32(h); }
    }
  }
  bytes_ += static_cast<int64_t>(t->nbytes);
  return out;
}

const TensorInfo* WeightBinder::get(const std::string& name, const std::string& expect) {
  const TensorInfo* t = ck_.find(name);
  if (!t) {
    note("missing tensor '" + name + "'" + ck_.name_note(name) + " (expected " + expect + ")");
    return nullptr;
  }
  used_.insert(name);
  return t;
}

WeightMatrix WeightBinder::bad(const std::string& name, const TensorInfo* t, const std::string& what) {
  note("tensor '" + name + "'" + ck_.name_note(name) + " in '" + t->file + "': " + what);
  return {};
}

// Keeps the first 20 problems for the message and counts the rest.
void WeightBinder::note(std::string problem) {
  if (problems_.size() < 20) problems_.push_back(std::move(problem));
  ++n_problems_;
}

// E8M0 0xFF is NaN in the OCP MX spec (v1.0, 5.4): every element of its block would decode to NaN
// and turn the whole forward pass into NaN logits, silently. One memchr over the scale bytes
// (1/17 of an MXFP4 matrix; measured in docs/testing.md) rejects it at load, naming the block.
// On a full K3 (~85 GB of scales, read from disk the first time) this takes a while: a progress line
// every 8 GB, so a long load does not look hung.
bool WeightBinder::scales_are_finite(const std::string& name, const TensorInfo* s, int64_t row_scale_bytes) {
  constexpr uint64_t kProgressBytes = uint64_t{8} << 30;
  if ((scanned_ + s->nbytes) / kProgressBytes > scanned_ / kProgressBytes)
    std::fprintf(stderr, "k3: checking MXFP4 scales: %.0f GB so far\n", double(scanned_ + s->nbytes) / 1e9);
  scanned_ += s->nbytes;
  const void* hit = std::memchr(s->data, 0xFF, s->nbytes);
  if (!hit) return true;
  const auto at = static_cast<int64_t>(static_cast<const uint8_t*>(hit) - s->data);
  bad(name, s, "E8M0 scale 255 (NaN in OCP MX) at row " + std::to_string(at / row_scale_bytes) + ", block " +
                   std::to_string(at % row_scale_bytes));
  return false;
}

// The tensor's data, or an aligned copy when the file places it at an address that is not a
// multiple of its element size (reading it in place would be undefined behaviour).
const void* WeightBinder::aligned(const TensorInfo* t) {
  const size_t a = dtype_size(t->dtype);
  if (a <= 1 || reinterpret_cast<uintptr_t>(t->data) % a == 0) return t->data;
  copies_.emplace_back(t->data, t->data + t->nbytes);
  return copies_.back().data();
}

void WeightBinder::check() const {
  if (n_problems_ == 0) return;
  std::ostringstream os;
  os << "checkpoint '" << ck_.dir() << "' does not match its config (" << n_problems_ << " problem"
     << (n_problems_ > 1 ? "s" : "") << "):";
  for (auto& p : problems_) os << "\n  " << p;
  if (n_problems_ > problems_.size()) os << "\n  ... and " << n_problems_ - problems_.size() << " more";
  throw Error(os.str());
}

int64_t WeightBinder::unused_tensors() const {
  int64_t unused = 0;
  for (auto& [name, t] : ck_.all())
    if (!used_.count(name)) ++unused;
  return unused;
}

}  // namespace k3
