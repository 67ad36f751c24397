// The CPU's decode layout of a Q4_K matrix (opt-in, K3_CPU_DECODE_LAYOUT=1): a second copy of its blocks, made once when a
// CPU runner is loaded to decode (Model::add_decode_layouts, called by the CLI's model loader for run / serve / bench /
// perplexity), that the
// avx512bf16 / amx tiers' one-token product reads instead of the stored rows (WeightMatrix::tiled). Why: a stored
// Q4_K row costs that product ~45 vector instructions per 256 weights (the 6-bit scales unpacked, the sub-scales
// spread over lanes, the per-row fp32 tail), ~21 cycles a block on a 2-core Zen 4, so one core decoded it at ~20-24
// GB/s -- below the 31.7 GB/s one core reads (docs/perf/cpu.md, session 42). With 16 rows interleaved, a vector lane
// is a row: one 64-byte load holds 8 quants of each of 16 rows, the activations' 4-value quads are broadcast, the
// sub-scales and the d / dmin of 16 rows are one load each: ~22 instructions per row and block (session 44).
// The copy is 2.8% larger than the rows (the 6-bit scales stored as bytes). Prefill (several tokens) keeps reading
// the stored rows; the two give the same bits (weight_kernels_vnni_k.cpp: the 16-row kernel forms each row's 8
// integer lanes and fp32 accumulators of the stored-row kernel).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "k3/core/weight.h"
#include "k3/runtime/expert_residency.h"  // ByteSpan

namespace k3 {
struct ModelWeights;
}

namespace k3::cpu {

// One group of 16 rows x one block of 256 columns, 2368 bytes (16 x 144 stored + 64), 64-byte aligned:
//   [0, 32)       d of rows 0..15 (f16, as stored)       [32, 64)   dmin of rows 0..15
//   [64, 192)     6-bit sub-scale j of row r at 64 + 16 j + r
//   [192, 320)    6-bit sub-min j of row r at 192 + 16 j + r
//   [320, 2368)   quants: sub-block j (32 values), part h (0..3) at 320 + 256 j + 64 h; byte 4 r + e holds in its low
//                 nibble element e of quad kquant_sub_block_quad(j, 2 h) (kquant_act_order.h) of row r, in its high
//                 nibble element e of quad kquant_sub_block_quad(j, 2 h + 1)
// Groups follow each other, each its blocks in order: group g, block b at (g * cols / 256 + b) * 2368. Rows past the
// last whole group are not in the copy (the kernel reads them stored).
inline constexpr int64_t kQ4KGroupRows = 16, kQ4KGroupBlockBytes = 2368;

// Whether W gets the copy: Q4_K on the host with at least 16 rows, the tier chosen at start-up has the kernel
// (avx512bf16, amx), and K3_CPU_DECODE_LAYOUT=1 (opt-in since session 45: no end-to-end gain measured at 2 or 16
// threads; same bits either way).
bool decode_layout_wanted(const WeightMatrix& W);
int64_t decode_layout_bytes(const WeightMatrix& W);
// Writes W's copy at out (decode_layout_bytes(W) bytes, 64-byte aligned).
void make_decode_layout(const WeightMatrix& W, uint8_t* out);

// The copies of a model's dense matrices (attention, KDA, shared experts, dense FFNs, the head; not the routed
// experts, whose residency the expert cache manages), in one allocation that owns them.
struct DecodeLayouts {
  std::shared_ptr<uint8_t> buf;
  int64_t bytes = 0, matrices = 0;
  int64_t released = 0;  // bytes of the stored matrices' pages given back (StoredExperts::release)
};
// Builds the copy of every wanted dense matrix of w and points its `tiled` at it.
DecodeLayouts add_decode_layouts(ModelWeights& w);

// The stored bytes the experts' copies replace, as their owner sees them (Model::add_decode_layouts: the checkpoint's
// file views, found by address; io/mapped_file.h). Empty functions: the stored bytes stay as they are.
struct StoredExperts {
  // How the memory of stored bytes is held: Kept (nothing gives it back), Mapped (pages of a file mapping: released,
  // they leave the process but stay in the page cache, which the kernel counts as available already), InMemory (the
  // file read into anonymous memory, --no-mmap: what a release gives back is what the copy took).
  enum class Held { Kept, Mapped, InMemory };
  std::function<Held(const ByteSpan&)> held;
  // Gives back the memory of these stored ranges (sorted, disjoint), which nothing reads any more; their bytes stay
  // readable and unchanged. Returns the bytes released.
  std::function<int64_t(std::span<const ByteSpan>)> release;
};

// The routed experts' decode copies: every MXFP4 expert matrix on the host repacked in 16-row blocks
// (mxfp4_rowblocks.h; the same bytes again, in one allocation), its `tiled` pointing at its copy, which the experts'
// products then read at every token count (matmul_batch; a token's result the same alone or batched), never its stored
// bytes again. So the copies REPLACE the stored experts: written a layer at a time, each layer's stored data and scales
// released (`stored.release`) as soon as its copies are written -- the process holds one layer twice at most, never
// the experts twice (Kimi-Linear-48B Q4_K_M at 16 threads held 27.96 GB + 25 GB of copies before; docs/perf/cpu.md).
// Made when the tier chosen at start-up is avx512bf16, amx or avx2int8 (the AVX2 form, session 66) and the memory the copies need beyond what they give back,
// at their peak, fits in half the memory available now (the expert residency's automatic budget, the same reading):
//  - stored bytes read into memory (--no-mmap): one layer's copies, the largest (built before that layer's release);
//  - stored bytes mapped from the file: all the copies -- they are anonymous memory that must stay, the page cache
//    they free was counted as available already (a model whose experts are bigger than that keeps reading its stored
//    experts from the mapping, as one bigger than RAM must);
//  - stored bytes nothing releases (`stored` empty, or not in a file view): all the copies.
// K3_CPU_MXFP4_ROWBLOCKS=0 turns them off, =1 makes them whatever the memory and the tier say (on a CPU that runs the
// product). Why the copies: the stored rows' one-token product is issue-bound at ~18 GB/s a core; the copy's, ~2x that
// (docs/perf/cpu.md, sessions 52-53).
DecodeLayouts add_expert_decode_layouts(ModelWeights& w, const StoredExperts& stored = {});

}  // namespace k3::cpu
