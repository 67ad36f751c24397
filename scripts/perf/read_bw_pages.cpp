// Read bandwidth of 2 threads (argv[1]: another count; session 33 ran 1 for one core's stream) streaming 1 GiB of anonymous memory: MADV_NOHUGEPAGE vs MADV_HUGEPAGE asked (whether the
// kernel grants 2 MB pages shows in /proc/meminfo's AnonHugePages). Session 32's --no-mmap study (docs/perf/cpu.md).
//   g++ -O2 -mavx512f -std=c++17 scripts/perf/read_bw_pages.cpp -o read_bw_pages -lpthread
#include <immintrin.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <thread>
#include <vector>
double run(const char* p, size_t n, int threads) {
  std::vector<std::thread> ts; std::vector<long long> sink(threads * 16);
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] {
    const size_t a = n / threads * t, b = a + n / threads;
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = a; i < b; i += 256) {
      _mm_prefetch(p + i + 4096, _MM_HINT_T1); _mm_prefetch(p + i + 4096 + 64, _MM_HINT_T1);
      _mm_prefetch(p + i + 4096 + 128, _MM_HINT_T1); _mm_prefetch(p + i + 4096 + 192, _MM_HINT_T1);
      acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i)); acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 64));
      acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 128)); acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 192));
    }
    sink[t * 16] = _mm512_reduce_add_epi64(acc);
  });
  for (auto& t : ts) t.join();
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}
void anon_huge() {  // while the buffer is live: whether the kernel granted 2 MB pages
  FILE* f = std::fopen("/proc/meminfo", "r");
  char line[256];
  while (f && std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "AnonHugePages", 13) == 0) std::printf("  %s", line);
  if (f) std::fclose(f);
}
int main(int argc, char** argv) {
  const size_t n = size_t{1} << 30;
  const int threads = std::clamp(argc > 1 ? std::atoi(argv[1]) : 2, 1, 256);
  for (int round = 1; round <= 2; ++round)  // the two page kinds alternate: round 2 repeats round 1
    for (int huge = 0; huge < 2; ++huge) {
      char* p = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (p == MAP_FAILED) return 1;
      madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
      memset(p, 1, n);
      double best = 0;
      for (int r = 0; r < 6; ++r) best = std::max(best, run(p, n, threads));
      anon_huge();
      std::printf("%s: best %.1f GB/s (%d threads)%s\n", huge ? "MADV_HUGEPAGE  " : "MADV_NOHUGEPAGE", best, threads,
                  round == 2 ? ", round 2" : "");
      munmap(p, n);
    }
}
