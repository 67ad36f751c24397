// Tensor: a view of a 2-D activation in one backend's memory (host or device), as the graph and the ops
// pass them. Rows are tokens (or token x head pairs), `cols` values each, `stride` elements apart. The
// view owns nothing: the backend's scratch arena (backend.h) or the caller owns the memory.
#pragma once
#include <cstdint>

namespace k3::graph {

enum class ElemType : uint8_t { F32, I32 };

struct Tensor {
  void* data = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;  // stride >= cols, in elements
  ElemType type = ElemType::F32;

  static Tensor f32(float* p, int64_t rows, int64_t cols) { return {p, rows, cols, cols, ElemType::F32}; }
  static Tensor i32(int32_t* p, int64_t rows, int64_t cols) { return {p, rows, cols, cols, ElemType::I32}; }

  float* f() const { return static_cast<float*>(data); }
  int32_t* i() const { return static_cast<int32_t*>(data); }
  float* row(int64_t r) const { return f() + r * stride; }
  int64_t count() const { return rows * cols; }
  bool contiguous() const { return stride == cols; }
  bool empty() const { return data == nullptr; }
  // Rows [r0, r0 + n) of this tensor.
  Tensor slice_rows(int64_t r0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + r0 * stride * 4;
    t.rows = n;
    return t;
  }
  // The same memory seen as [rows * cols / c][c] (contiguous tensors only).
  Tensor reshape(int64_t c) const { return {data, rows * cols / c, c, c, type}; }
};

}  // namespace k3::graph
