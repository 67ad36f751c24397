// By-hand oracle (not built by CMake, never committed as a binary): llama.cpp's ggml as the reference for
// k3's GGUF block formats.
//
//   golden DIR [BLOCKS] [SEED]: for each type, BLOCKS random valid blocks (random bytes; the f16 scale
//       fields set to random finite values, normal and subnormal) and the floats ggml's to_float gives for
//       them, into DIR/<TYPE>.bin = "K3QG" u32 version=1, u32 nblocks, u32 block_bytes, u32 block_elems,
//       then the blocks, then nblocks * block_elems float32 (little-endian). k3's test
//       (QuantGolden.*, tests/unit/test_quant_formats.cpp) checks k3's dequantisation bit for bit on the
//       committed tests/data/quant-golden/ and, with K3_QUANT_GOLDEN_DIR=DIR, on a larger set made here.
//   rms ROWS COLS [SEED] [ROWS_FILE] [IMP_FILE]: ggml_quantize_chunk on Gaussian rows (no imatrix), then
//       to_float; prints the RMS error relative to the rows' RMS per type, for docs/quantization.md. ROWS_FILE:
//       the rows as raw float32, for k3's side on the same rows (K3_QUANT_RMS_ROWS=ROWS_FILE, COLS 4096:
//       QuantRms.GaussianRowsWithinBounds). IMP_FILE: also writes COLS importance weights (log-normal,
//       exp(N(0, 1)), seeded SEED + 1: a few columns far above the rest, as real imatrices have) and
//       quantises every type again with them as the imatrix, printing the plain and the importance-weighted
//       relative RMS (sqrt(sum w e^2 / sum w x^2)); k3's side: K3_QUANT_RMS_IMPORTANCE=IMP_FILE
//       (QuantRms.CodebookRowsWithImportance).
//   speed ROWS COLS [REPS]: M weights/s of ggml_quantize_chunk per type on one thread, Gaussian rows, a
//       log-normal imatrix (as rms), the best of REPS runs (default 3) in CPU time of the thread
//       (CLOCK_THREAD_CPUTIME_ID: on a shared box wall time counts the other processes' turns).
//
// Build (llama.cpp built at /work/llama-native, sources at $LLAMA):
//   g++ -O2 -std=c++17 -I$LLAMA/ggml/include scripts/peer/ggml_quant_oracle.cpp \
//       /work/llama-native/ggml/src/libggml-base.a -lm -lpthread -fopenmp -o /tmp/ggml_quant_oracle
//   or, where only the shared library was built:
//       ... -L/work/llama-native/bin -lggml-base -Wl,-rpath,/work/llama-native/bin -o /tmp/ggml_quant_oracle
#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml.h"

namespace {

// This thread's CPU time in seconds: on a shared box, wall time counts the other processes' turns.
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Type {
  ggml_type type;
  const char* name;                 // k3's WeightFormat name
  std::vector<int> f16_offsets;     // where the block's f16 scales are
};

const std::vector<Type> kTypes = {
    {GGML_TYPE_Q8_0, "Q8_0", {0}},     {GGML_TYPE_Q4_K, "Q4_K", {0, 2}},  {GGML_TYPE_Q5_K, "Q5_K", {0, 2}},
    {GGML_TYPE_Q6_K, "Q6_K", {208}},   {GGML_TYPE_Q3_K, "Q3_K", {108}},   {GGML_TYPE_Q2_K, "Q2_K", {80, 82}},
    {GGML_TYPE_IQ4_XS, "IQ4_XS", {0}},  {GGML_TYPE_IQ3_XXS, "IQ3_XXS", {0}}, {GGML_TYPE_IQ3_S, "IQ3_S", {0}},
    {GGML_TYPE_IQ2_XXS, "IQ2_XXS", {0}}, {GGML_TYPE_IQ2_XS, "IQ2_XS", {0}}, {GGML_TYPE_IQ2_S, "IQ2_S", {0}},
    {GGML_TYPE_IQ1_S, "IQ1_S", {0}},     {GGML_TYPE_IQ1_M, "IQ1_M", {}},  // IQ1_M: d in 4 nibbles, below
    {GGML_TYPE_Q4_0, "Q4_0", {0}},       {GGML_TYPE_Q4_1, "Q4_1", {0, 2}}, {GGML_TYPE_Q5_0, "Q5_0", {0}},
    {GGML_TYPE_Q5_1, "Q5_1", {0, 2}},    {GGML_TYPE_IQ4_NL, "IQ4_NL", {0}},
};
// The formats whose quantiser needs no importance matrix (ggml_quantize_chunk; the rms mode): all but
// IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M. (IQ3_XXS, IQ3_S, IQ2_S then weigh errors by x^2 or sigma^2 / 4 + x^2.)
bool quantises_without_imatrix(ggml_type t) { return !ggml_quantize_requires_imatrix(t); }

// A random finite f16: mostly normal with exponents across the range, sometimes subnormal.
uint16_t random_f16(std::mt19937& rng) {
  const uint16_t sign = (rng() & 1) << 15, man = rng() & 0x3ff;
  const uint16_t exp = rng() % 8 == 0 ? 0 : 1 + rng() % 30;
  return sign | (exp << 10) | man;
}

void put_u32(FILE* f, uint32_t v) { fwrite(&v, 4, 1, f); }

int golden(const char* dir, int blocks, unsigned seed) {
  std::mt19937 rng(seed);
  for (const Type& t : kTypes) {
    const ggml_type_traits* tr = ggml_get_type_traits(t.type);
    const size_t bb = tr->type_size, be = static_cast<size_t>(tr->blck_size);
    std::vector<uint8_t> bytes(bb * blocks);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    for (int i = 0; i < blocks; ++i)
      for (int off : t.f16_offsets) {
        const uint16_t h = random_f16(rng);
        std::memcpy(&bytes[i * bb + off], &h, 2);
      }
    if (t.type == GGML_TYPE_IQ1_M)  // d: the top nibbles of the 4 u16 at byte 48
      for (int i = 0; i < blocks; ++i) {
        const uint16_t h = random_f16(rng);
        for (int k = 0; k < 4; ++k) {
          uint8_t& hb = bytes[i * bb + 49 + 2 * k];
          hb = static_cast<uint8_t>((hb & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
        }
      }
    std::vector<float> vals(be * blocks);
    tr->to_float(bytes.data(), vals.data(), static_cast<int64_t>(vals.size()));
    const std::string path = std::string(dir) + "/" + t.name + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return std::perror(path.c_str()), 1;
    std::fwrite("K3QG", 1, 4, f);
    put_u32(f, 1);
    put_u32(f, static_cast<uint32_t>(blocks));
    put_u32(f, static_cast<uint32_t>(bb));
    put_u32(f, static_cast<uint32_t>(be));
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fwrite(vals.data(), 4, vals.size(), f);
    std::fclose(f);
    std::printf("%s: %d blocks of %zu bytes -> %s\n", t.name, blocks, bb, path.c_str());
  }
  return 0;
}

std::vector<float> gaussian_rows(int rows, int cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (auto& v : x) v = nd(rng);
  return x;
}

// exp(N(0, 1)) per column: the importance vector of the rms and speed modes.
std::vector<float> lognormal_importance(int cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> imp(static_cast<size_t>(cols));
  for (auto& v : imp) v = std::exp(nd(rng));
  return imp;
}

bool write_floats(const char* path, const std::vector<float>& v) {
  FILE* f = std::fopen(path, "wb");
  if (!f) return std::perror(path), false;
  std::fwrite(v.data(), 4, v.size(), f);
  std::fclose(f);
  return true;
}

// Quantises x (rows x cols) as t with imatrix imp (or null) and returns the dequantised values.
std::vector<float> round_trip(const Type& t, const std::vector<float>& x, int rows, int cols, const float* imp) {
  std::vector<uint8_t> q(ggml_row_size(t.type, cols) * rows);
  ggml_quantize_chunk(t.type, x.data(), q.data(), 0, rows, cols, imp);
  std::vector<float> y(x.size());
  ggml_get_type_traits(t.type)->to_float(q.data(), y.data(), static_cast<int64_t>(y.size()));
  return y;
}

int rms(int rows, int cols, unsigned seed, const char* rows_file, const char* imp_file) {
  const std::vector<float> x = gaussian_rows(rows, cols, seed);
  if (rows_file && !write_floats(rows_file, x)) return 1;
  double sx = 0;
  for (float v : x) sx += double(v) * v;
  for (const Type& t : kTypes) {
    if (!quantises_without_imatrix(t.type)) continue;
    const std::vector<float> y = round_trip(t, x, rows, cols, nullptr);
    double se = 0;
    for (size_t i = 0; i < x.size(); ++i) se += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    std::printf("%-7s rel RMS error %.5f\n", t.name, std::sqrt(se / sx));
  }
  if (!imp_file) return 0;
  const std::vector<float> imp = lognormal_importance(cols, seed + 1);
  if (!write_floats(imp_file, imp)) return 1;
  for (const Type& t : kTypes) {
    const std::vector<float> y = round_trip(t, x, rows, cols, imp.data());
    double se = 0, wse = 0, wsx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = (double(x[i]) - y[i]) * (double(x[i]) - y[i]), w = imp[i % cols];
      se += e, wse += w * e, wsx += w * double(x[i]) * x[i];
    }
    std::printf("%-7s with imatrix: rel RMS %.5f, weighted rel RMS %.5f\n", t.name, std::sqrt(se / sx), std::sqrt(wse / wsx));
  }
  return 0;
}

int speed(int rows, int cols, int reps) {
  const std::vector<float> x = gaussian_rows(rows, cols, 1);
  const std::vector<float> imp = lognormal_importance(cols, 2);
  for (const Type& t : kTypes) {
    std::vector<uint8_t> q(ggml_row_size(t.type, cols) * rows);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = cpu_now();
      ggml_quantize_chunk(t.type, x.data(), q.data(), 0, rows, cols, imp.data());
      best = std::min(best, (cpu_now() - t0));
    }
    std::printf("%-7s %8.2f M weights/s (one thread's CPU time, imatrix)\n", t.name, double(rows) * cols / best / 1e6);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ggml_quantize_init(GGML_TYPE_IQ4_XS);
  if (argc >= 3 && std::string(argv[1]) == "golden")
    return golden(argv[2], argc > 3 ? std::atoi(argv[3]) : 4, argc > 4 ? std::atoi(argv[4]) : 1);
  if (argc >= 4 && std::string(argv[1]) == "rms")
    return rms(std::atoi(argv[2]), std::atoi(argv[3]), argc > 4 ? std::atoi(argv[4]) : 1, argc > 5 ? argv[5] : nullptr,
               argc > 6 ? argv[6] : nullptr);
  if (argc >= 4 && std::string(argv[1]) == "speed")
    return speed(std::atoi(argv[2]), std::atoi(argv[3]), argc > 4 ? std::atoi(argv[4]) : 3);
  std::fprintf(stderr, "usage: %s golden DIR [BLOCKS] [SEED] | rms ROWS COLS [SEED] [ROWS_FILE] [IMP_FILE] | speed ROWS COLS [REPS]\n", argv[0]);
  return 2;
}
