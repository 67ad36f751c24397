// One core reading 1 GiB as 418 KB chunks (an expert matrix's bytes) in random order vs in order, 64-byte loads,
// with a prefetch into L2 4 KB ahead inside each chunk (as mxfp4_one_token_rows), and with the next chunk's first 4 KB
// prefetched at the end of each chunk: whether an expert matrix being a new stream costs the one-token MXFP4 kernel its
// bandwidth (docs/perf/cpu.md, session 33).
//   g++ -O2 -mavx512f -std=c++17 scripts/perf/stream_chunks.cpp -o stream_chunks
#include <immintrin.h>
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>
int main() {
  const size_t n = size_t{1} << 30, chunk = 418 * 1024;
  char* p = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(p, n, MADV_HUGEPAGE);
  memset(p, 1, n);
  const size_t nc = n / chunk;
  std::vector<size_t> order(nc);
  std::iota(order.begin(), order.end(), 0);
  std::vector<size_t> shuffled = order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));
  for (int mode = 0; mode < 4; ++mode) {
    const std::vector<size_t>& ord = mode % 2 ? shuffled : order;
    const bool cross = mode >= 2;
    double best = 0;
    __m512i acc = _mm512_setzero_si512();
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < nc; ++i) {
        const char* c = p + ord[i] * chunk;
        for (size_t o = 0; o < chunk; o += 64) {
          if ((o & 255) == 0 && o + 4096 < chunk) _mm_prefetch(c + o + 4096, _MM_HINT_T1);
          if (cross && o + 4096 >= chunk && i + 1 < nc && (o & 255) == 0) _mm_prefetch(p + ord[i + 1] * chunk + (o + 4096 - chunk), _MM_HINT_T1);
          acc = _mm512_add_epi32(acc, _mm512_loadu_si512(c + o));
        }
      }
      best = std::max(best, nc * chunk / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
    }
    std::printf("%-8s %-28s %.1f GB/s (%d)\n", mode % 2 ? "random" : "in order", cross ? "+ next chunk's first 4 KB" : "prefetch within the chunk",
                best, _mm512_reduce_add_epi32(acc) & 1);
  }
}
