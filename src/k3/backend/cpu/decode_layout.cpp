#include "k3/backend/cpu/decode_layout.h"

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

void for_each_expert_matrix(ModelWeights& w, const std::function<void(WeightMatrix&)>& fn) {
  for (LayerWeights& l : w.layers)
    if (l.is_moe)
      for (GluMlp& e : l.moe.experts)
        for (WeightMatrix* m : {&e.gate, &e.up, &e.down}) fn(*m);
}

}  // namespace

DecodeLayouts add_expert_decode_layouts(ModelWeights& w) {
  DecodeLayouts d;
  const CpuIsa isa = active_cpu_isa();
  const int forced = expert_copies_forced();
  // forced on: whatever the tier (the tests' exact one too), where the CPU runs the product
  if (forced == 0 || !mxfp4_rowblocks_cpu_ok() || (forced < 0 && isa != CpuIsa::Avx512Bf16 && isa != CpuIsa::Amx)) return d;
  std::vector<WeightMatrix*> todo;
  for_each_expert_matrix(w, [&](WeightMatrix& W) {
    if (W.device == kHostDevice && W.tiled == nullptr && mxfp4_rowblocks_supported(W)) {
      todo.push_back(&W);
      d.bytes += mxfp4_rowblocks_bytes(W);
    }
  });
  if (d.bytes == 0) return d;
  // half the memory available now: the expert residency's automatic budget, from the same reading
  if (forced < 0 && d.bytes > ExpertResidency::auto_budget(0)) return DecodeLayouts{};
  d.buf = aligned_buffer(d.bytes);
  std::vector<int64_t> at(todo.size() + 1, 0);
  for (size_t i = 0; i < todo.size(); ++i) at[i + 1] = at[i] + mxfp4_rowblocks_bytes(*todo[i]);
  ThreadPool::global().parallel_for(static_cast<int64_t>(todo.size()), 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) mxfp4_rowblocks_write(*todo[static_cast<size_t>(i)], d.buf.get() + at[static_cast<size_t>(i)]);
  });
  for (size_t i = 0; i < todo.size(); ++i) todo[i]->tiled = d.buf.get() + at[i];
  d.matrices = static_cast<int64_t>(todo.size());
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
