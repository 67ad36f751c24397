// The CPU backend's per-format row kernels and its one dispatch point on WeightFormat (row_kernels).
// AVX2+FMA, weights converted in registers; see weight_kernels.h for the contracts.
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/backend/cpu/weight_gemm.h"
#include "k3/backend/cpu/weight_kernels_avx2int8.h"
#include "k3/backend/cpu/weight_kernels_avx512.h"
#include "k3/backend/cpu/weight_kernels_avx512bf16.h"
#include "k3/backend/cpu/weight_kernels_amx.h"
#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/backend/cpu/weight_simd.h"

#include "k3/backend/cpu/cpu_isa.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <initializer_list>
#include <utility>

namespace k3::cpu {

using namespace simd;

float dot_f32(const float* w, const float* x, int64_t n) {
  return dot_loop(w, x, n, [](const float* p) { return _mm256_loadu_ps(p); }, [](float v) { return v; });
}

namespace {

// Lambdas, not function pointers, so that the loads are inlined into the loop.
float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
  return dot_loop(w, x, n, [](const uint16_t* p) { return load_bf16x8(p); }, [](uint16_t v) { return bf16_to_f32(v); });
}
float dot_f16(const uint16_t* w, const float* x, int64_t n) {
  return dot_loop(w, x, n, [](const uint16_t* p) { return load_f16x8(p); }, [](uint16_t v) { return f16_to_f32(v); });
}

template <WeightFormat F>
float dot_mxfp4(const uint8_t* packed, const uint8_t* scales, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t g = 0; g < n / kMxfp4Group; ++g) {
    const uint8_t s = load_mxfp4_group<F>(packed, scales, g, w);
    acc = _mm256_fmadd_ps(mxfp4_group_dot(w, x + g * kMxfp4Group), mxfp4_scale(s), acc);
  }
  return hsum(acc);
}

// ---- the row kernels of each format ----

float f32_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_f32(static_cast<const float*>(W.data) + r * W.cols, x, W.cols);
}
float bf16_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_bf16(static_cast<const uint16_t*>(W.data) + r * W.cols, x, W.cols);
}
float f16_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_f16(static_cast<const uint16_t*>(W.data) + r * W.cols, x, W.cols);
}
template <WeightFormat F>
float mxfp4_dot(const WeightMatrix& W, int64_t r, const float* x) {
  return dot_mxfp4<F>(W.row_data(r), W.row_scales(r), x, W.cols);
}

void f32_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const float* p = static_cast<const float*>(W.data) + r * W.cols;
  for (int64_t i = 0; i < W.cols; ++i) out[i] = p[i];
}
void bf16_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint16_t* p = static_cast<const uint16_t*>(W.data) + r * W.cols;
  for (int64_t i = 0; i < W.cols; ++i) out[i] = bf16_to_f32(p[i]);
}
void f16_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint16_t* p = static_cast<const uint16_t*>(W.data) + r * W.cols;
  for (int64_t i = 0; i < W.cols; ++i) out[i] = f16_to_f32(p[i]);
}
template <WeightFormat F>
void mxfp4_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint8_t* p = W.row_data(r);
  const uint8_t* s = W.row_scales(r);
  __m256 w[4];
  for (int64_t g = 0; g < W.cols / kMxfp4Group; ++g) {
    const __m256 sc = mxfp4_scale(load_mxfp4_group<F>(p, s, g, w));
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + g * 32 + k * 8, _mm256_mul_ps(w[k], sc));
  }
}

constexpr RowKernels kF32{f32_dot, f32_dequant, gemm_f32, nullptr};
constexpr RowKernels kF16{f16_dot, f16_dequant, gemm_f16, nullptr};
constexpr RowKernels kBF16{bf16_dot, bf16_dequant, gemm_bf16, nullptr};
constexpr RowKernels kMXFP4{mxfp4_dot<WeightFormat::MXFP4>, mxfp4_dequant<WeightFormat::MXFP4>, gemm_mxfp4, nullptr};
constexpr RowKernels kMXFP4Ggml{mxfp4_dot<WeightFormat::MXFP4_GGML>, mxfp4_dequant<WeightFormat::MXFP4_GGML>,
                                gemm_mxfp4_ggml, nullptr};

// Kernel tables per CPU tier (cpu_isa.h), indexed by WeightFormat: avx2 (above), avx2int8, avx512
// (weight_kernels_avx512.cpp) and avx512bf16; GGUF's block formats from weight_kernels_quant.cpp.
constexpr size_t kTableSize = 32;  // > every WeightFormat value (checked in make_table)
using FormatTable = std::array<const RowKernels*, kTableSize>;
using QuantKernels = const RowKernels* (*)(WeightFormat);

FormatTable make_table(std::initializer_list<std::pair<WeightFormat, const RowKernels*>> floats, QuantKernels quant) {
  FormatTable t{};
  for (const auto& [f, k] : floats) t.at(static_cast<size_t>(f)) = k;
  for (size_t i = 0; i < kTableSize; ++i)
    if (const RowKernels* k = quant(static_cast<WeightFormat>(i))) t[i] = k;
  return t;
}

const FormatTable kAvx2Table = make_table(
    {{WeightFormat::F32, &kF32}, {WeightFormat::F16, &kF16}, {WeightFormat::BF16, &kBF16}, {WeightFormat::MXFP4, &kMXFP4},
     {WeightFormat::MXFP4_GGML, &kMXFP4Ggml}},
    avx2_quant_row_kernels);
// avx2int8: MXFP4 (both layouts) and Q8_0 / Q4_K / Q5_K / Q6_K on int8 activations
// (weight_kernels_avx2int8.cpp); every other format
// runs avx2's exact kernels (BF16 stays exact: AVX2 has no bf16 dot product to gain from).
const FormatTable kAvx2Int8Table = make_table(
    {{WeightFormat::F32, &kF32}, {WeightFormat::F16, &kF16}, {WeightFormat::BF16, &kBF16},
     {WeightFormat::MXFP4, avx2int8_row_kernels(WeightFormat::MXFP4, kMXFP4)},
     {WeightFormat::MXFP4_GGML, avx2int8_row_kernels(WeightFormat::MXFP4_GGML, kMXFP4Ggml)}},
    avx2int8_quant_row_kernels);
const FormatTable kAvx512Table = make_table({{WeightFormat::F32, avx512_row_kernels(WeightFormat::F32)},
                                             {WeightFormat::F16, avx512_row_kernels(WeightFormat::F16)},
                                             {WeightFormat::BF16, avx512_row_kernels(WeightFormat::BF16)},
                                             {WeightFormat::MXFP4, avx512_row_kernels(WeightFormat::MXFP4)},
                                             {WeightFormat::MXFP4_GGML, avx512_row_kernels(WeightFormat::MXFP4_GGML)}},
                                            avx512_quant_row_kernels);

// avx512bf16 has its own BF16 and MXFP4 (both layouts) kernels (weight_kernels_avx512bf16.cpp) and GGUF block
// kernels on int8 activations (weight_kernels_quant_vnni.cpp); F32 and F16 run avx512's (no cheaper path
// for them, and no reason to round their activations).
const FormatTable kAvx512Bf16Table = make_table({{WeightFormat::F32, avx512_row_kernels(WeightFormat::F32)},
                                                 {WeightFormat::F16, avx512_row_kernels(WeightFormat::F16)},
                                                 {WeightFormat::BF16, avx512bf16_row_kernels(WeightFormat::BF16)},
                                                 {WeightFormat::MXFP4, avx512bf16_row_kernels(WeightFormat::MXFP4)},
                                                 {WeightFormat::MXFP4_GGML, avx512bf16_row_kernels(WeightFormat::MXFP4_GGML)}},
                                                avx512bf16_quant_row_kernels);

// amx: BF16 on AMX tiles (weight_kernels_amx.cpp); everything else as avx512bf16 serves it (MXFP4 and the GGUF
// block formats keep their int8 VNNI kernels: AMX-INT8 has no per-32-group scale step).
const FormatTable kAmxTable = make_table({{WeightFormat::F32, avx512_row_kernels(WeightFormat::F32)},
                                          {WeightFormat::F16, avx512_row_kernels(WeightFormat::F16)},
                                          {WeightFormat::BF16, amx_row_kernels(WeightFormat::BF16)},
                                          {WeightFormat::MXFP4, avx512bf16_row_kernels(WeightFormat::MXFP4)},
                                          {WeightFormat::MXFP4_GGML, avx512bf16_row_kernels(WeightFormat::MXFP4_GGML)}},
                                         avx512bf16_quant_row_kernels);

const FormatTable* tier_table(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return &kAvx2Table;
    case CpuIsa::Avx2Int8: return &kAvx2Int8Table;
    case CpuIsa::Avx512: return &kAvx512Table;
    case CpuIsa::Avx512Bf16: return &kAvx512Bf16Table;
    case CpuIsa::Amx: return &kAmxTable;
  }
  return nullptr;
}

// The tier a test forced (force_cpu_isa_for_testing); null: the one chosen at start-up.
std::atomic<const FormatTable*> g_forced_table{nullptr};
std::atomic<CpuIsa> g_forced_isa{CpuIsa::Avx2};  // meaningful while g_forced_table is set

}  // namespace

bool isa_has_kernels(CpuIsa isa) { return tier_table(isa) != nullptr; }

const RowKernels& row_kernels(WeightFormat f) {
  // The tier is chosen once per process (cpu_state: the CPU's best tier with kernels, or $K3_CPU_ISA).
  static const FormatTable& chosen = *tier_table(active_cpu_isa());
  const FormatTable* forced = g_forced_table.load(std::memory_order_relaxed);
  const FormatTable& table = forced ? *forced : chosen;
  const auto i = static_cast<size_t>(f);
  if (i < table.size() && table[i]) return *table[i];
  throw Error(std::string("CPU backend: weight format ") + weight_format_name(f) + " has no kernels");
}

void force_cpu_isa_for_testing(std::optional<CpuIsa> isa) {
  if (!isa) {
    g_forced_table.store(nullptr);
    return;
  }
  const CpuState& cpu = cpu_state();
  if (const std::string m = isa_missing_features(cpu.features, *isa, cpu.amx_status == "granted"); !m.empty())
    throw Error(std::string("force_cpu_isa_for_testing: this CPU cannot run ") + isa_name(*isa) + " (missing: " + m + ")");
  if (!tier_table(*isa)) throw Error(std::string("force_cpu_isa_for_testing: no ") + isa_name(*isa) + " kernels");
  g_forced_isa.store(*isa);
  g_forced_table.store(tier_table(*isa));
}

CpuIsa active_tier_for_testing() { return g_forced_table.load() ? g_forced_isa.load() : active_cpu_isa(); }

}  // namespace k3::cpu
