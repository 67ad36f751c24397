#include "k3/backend/cpu/decode_layout.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/kquant_act_order.h"
#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/core/thread_pool.h"
#include "k3/model/weights.h"
#include "k3/quant/block_decode.h"
#include "k3/runtime/expert_residency.h"

namespace k3::cpu {
namespace {

constexpr int64_t kQK = 256, kStoredBlock = 144;

// Opt-in since session 45 (K3_CPU_DECODE_LAYOUT=1): end to end it measured within noise at 2 threads on Zen 4
// (+6% at one thread) and 1-11% slower at 16 threads on the H200 host's Xeon (call s45-1, docs/perf/cpu.md), while
// costing load time and +2.8% of the Q4_K bytes.
bool layout_turned_on() {
  static const bool on = [] {
    const char* e = std::getenv("K3_CPU_DECODE_LAYOUT");
    return e != nullptr && std::string(e) == "1";
  }();
  return on;
}

// A stored Q4_K block's 256 quants in natural order: value 64 c + i is the low nibble of byte 32 c + i (i < 32), the
// high nibble of byte 32 c + i - 32 (i >= 32).
void natural_quants(const uint8_t* qs, uint8_t* q) {
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 32; ++i) {
      q[64 * c + i] = qs[32 * c + i] & 15;
      q[64 * c + 32 + i] = qs[32 * c + i] >> 4;
    }
}

// Group g (rows 16 g .. 16 g + 15), block b of W into out (kQ4KGroupBlockBytes: every byte written).
void group_block(const WeightMatrix& W, int64_t g, int64_t b, uint8_t* out) {
  for (int r = 0; r < kQ4KGroupRows; ++r) {
    const uint8_t* blk = W.row_data(g * kQ4KGroupRows + r) + b * kStoredBlock;
    std::memcpy(out + 2 * r, blk, 2);
    std::memcpy(out + 32 + 2 * r, blk + 2, 2);
    for (int j = 0; j < 8; ++j) {
      int sc = 0, m = 0;
      quant::k4_scale_min(j, blk + 4, &sc, &m);
      out[64 + 16 * j + r] = static_cast<uint8_t>(sc);
      out[192 + 16 * j + r] = static_cast<uint8_t>(m);
    }
    uint8_t q[kQK];
    natural_quants(blk + 16, q);
    for (int j = 0; j < 8; ++j)
      for (int h = 0; h < 4; ++h)
        for (int e = 0; e < 4; ++e) {
          const int lo = kquant_quad_first(kKquantSubBlockQuads.q[j][2 * h]) + e;
          const int hi = kquant_quad_first(kKquantSubBlockQuads.q[j][2 * h + 1]) + e;
          out[320 + 256 * j + 64 * h + 4 * r + e] = static_cast<uint8_t>(q[lo] | q[hi] << 4);
        }
  }
}

}  // namespace

bool decode_layout_wanted(const WeightMatrix& W) {
  const CpuIsa isa = active_cpu_isa();
  return W.format == WeightFormat::Q4_K && W.device == kHostDevice && W.data != nullptr && W.rows >= kQ4KGroupRows &&
         W.cols % kQK == 0 && (isa == CpuIsa::Avx512Bf16 || isa == CpuIsa::Amx) && layout_turned_on();
}

int64_t decode_layout_bytes(const WeightMatrix& W) {
  return W.rows / kQ4KGroupRows * (W.cols / kQK) * kQ4KGroupBlockBytes;
}

void make_decode_layout(const WeightMatrix& W, uint8_t* out) {
  const int64_t blocks = W.cols / kQK;
  ThreadPool::global().parallel_for(W.rows / kQ4KGroupRows, 0, [&](int64_t g0, int64_t g1, int) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < blocks; ++b) group_block(W, g, b, out + (g * blocks + b) * kQ4KGroupBlockBytes);
  });
}

namespace {

std::shared_ptr<uint8_t> aligned_buffer(int64_t bytes) {
  void* raw = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
  if (raw == nullptr) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(raw), [](uint8_t* p) { std::free(p); });
}

// -1: K3_CPU_MXFP4_ROWBLOCKS unset (the memory decides), 0 / 1: as set.
int expert_copies_forced() {
  const char* e = std::getenv("K3_CPU_MXFP4_ROWBLOCKS");
  if (e == nullptr || *e == '\0') return -1;
  return std::string(e) == "0" ? 0 : 1;
}

// One MoE layer's matrices that get copies, and the copies' bytes.
struct LayerCopies {
  std::vector<WeightMatrix*> todo;
  int64_t bytes = 0;
};

std::vector<LayerCopies> plan_expert_copies(ModelWeights& w) {
  std::vector<LayerCopies> out;
  for (LayerWeights& l : w.layers) {
    if (!l.is_moe) continue;
    LayerCopies c;
    for (GluMlp& e : l.moe.experts)
      for (WeightMatrix* m : {&e.gate, &e.up, &e.down})
        if (m->device == kHostDevice && m->tiled == nullptr && mxfp4_rowblocks_supported(*m)) {
          c.todo.push_back(m);
          c.bytes += mxfp4_rowblocks_bytes(*m);
        }
    if (!c.todo.empty()) out.push_back(std::move(c));
  }
  return out;
}

// The stored byte ranges of W (its data, and its scales where apart).
std::vector<ByteSpan> stored_spans(const WeightMatrix& W) {
  std::vector<ByteSpan> s{{static_cast<const uint8_t*>(W.data), static_cast<size_t>(W.rows * row_data_bytes(W.format, W.cols))}};
  if (W.scales != nullptr) s.push_back({W.scales, static_cast<size_t>(W.rows * row_scale_bytes(W.format, W.cols))});
  return s;
}

// The memory the copies need beyond what is in use now, at their peak (the memory rule of decode_layout.h): a copy
// whose stored bytes are read into memory costs only while its layer is being written (that layer's stored bytes are
// released right after); any other copy costs its full size.
int64_t copies_peak_need(const std::vector<LayerCopies>& layers, const StoredExperts& stored) {
  int64_t full = 0, largest_layer = 0;
  for (const LayerCopies& l : layers) {
    int64_t transient = 0;
    for (const WeightMatrix* m : l.todo) {
      bool in_memory = static_cast<bool>(stored.held);
      for (const ByteSpan& s : stored_spans(*m)) in_memory = in_memory && stored.held(s) == StoredExperts::Held::InMemory;
      (in_memory ? transient : full) += mxfp4_rowblocks_bytes(*m);
    }
    largest_layer = std::max(largest_layer, transient);
  }
  return full + largest_layer;
}

// Sorted, overlapping or touching ranges joined (one release per run of neighbouring tensors: the pages between
// two tensors are whole only in the joined range).
std::vector<ByteSpan> joined(std::vector<ByteSpan> s) {
  std::sort(s.begin(), s.end(), [](const ByteSpan& a, const ByteSpan& b) { return std::less<>()(a.data, b.data); });
  std::vector<ByteSpan> out;
  for (const ByteSpan& x : s) {
    const auto b = reinterpret_cast<uintptr_t>(x.data);
    if (!out.empty()) {
      const auto ob = reinterpret_cast<uintptr_t>(out.back().data);
      if (b <= ob + out.back().size) {
        out.back().size = std::max(ob + out.back().size, b + x.size) - ob;
        continue;
      }
    }
    out.push_back(x);
  }
  return out;
}

// Writes one layer's copies at out (in parallel over its matrices), points each matrix at its copy, then gives back
// the layer's stored bytes (nothing reads them any more). Returns the bytes released.
int64_t write_layer(const LayerCopies& l, uint8_t* out, const StoredExperts& stored) {
  std::vector<int64_t> at(l.todo.size() + 1, 0);
  for (size_t i = 0; i < l.todo.size(); ++i) at[i + 1] = at[i] + mxfp4_rowblocks_bytes(*l.todo[i]);
  ThreadPool::global().parallel_for(static_cast<int64_t>(l.todo.size()), 1, [&](int64_t i0, int64_t i1, int) {
    for (auto i = static_cast<size_t>(i0); i < static_cast<size_t>(i1); ++i) mxfp4_rowblocks_write(*l.todo[i], out + at[i]);
  });
  std::vector<ByteSpan> spans;
  for (size_t i = 0; i < l.todo.size(); ++i) {
    l.todo[i]->tiled = out + at[i];
    for (const ByteSpan& s : stored_spans(*l.todo[i])) spans.push_back(s);
  }
  return stored.release ? stored.release(joined(std::move(spans))) : 0;
}

}  // namespace

DecodeLayouts add_expert_decode_layouts(ModelWeights& w, const StoredExperts& stored) {
  DecodeLayouts d;
  const CpuIsa isa = active_cpu_isa();
  const int forced = expert_copies_forced();
  // forced on: whatever the tier (the tests' exact one too), where the CPU runs the product
  if (forced == 0 || !mxfp4_rowblocks_cpu_ok() ||
      (forced < 0 && isa != CpuIsa::Avx512Bf16 && isa != CpuIsa::Amx && isa != CpuIsa::Avx2Int8))
    return d;
  const std::vector<LayerCopies> layers = plan_expert_copies(w);
  for (const LayerCopies& l : layers) d.bytes += l.bytes;
  if (d.bytes == 0) return d;
  // half the memory available now: the expert residency's automatic budget, from the same reading
  if (forced < 0 && copies_peak_need(layers, stored) > ExpertResidency::auto_budget(0)) return DecodeLayouts{};
  // One allocation, its pages taken as each layer's copies are written (large: mapped lazily by the allocator).
  d.buf = aligned_buffer(d.bytes);
  int64_t at = 0;
  for (const LayerCopies& l : layers) {
    d.released += write_layer(l, d.buf.get() + at, stored);
    at += l.bytes;
    d.matrices += static_cast<int64_t>(l.todo.size());
  }
  return d;
}

DecodeLayouts add_decode_layouts(ModelWeights& w) {
  DecodeLayouts d;
  for_each_dense_matrix(w, [&](WeightMatrix& W) {
    if (&W != &w.embed && decode_layout_wanted(W)) d.bytes += decode_layout_bytes(W);
  });
  if (d.bytes == 0) return d;
  d.buf = aligned_buffer(d.bytes);
  int64_t at = 0;
  for_each_dense_matrix(w, [&](WeightMatrix& W) {
    if (&W == &w.embed || !decode_layout_wanted(W)) return;
    make_decode_layout(W, d.buf.get() + at);
    W.tiled = d.buf.get() + at;
    at += decode_layout_bytes(W);
    ++d.matrices;
  });
  return d;
}

}  // namespace k3::cpu
