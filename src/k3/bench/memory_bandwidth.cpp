#include "k3/bench/memory_bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/thread_pool.h"

namespace k3::bench {

namespace {
constexpr size_t kMinBytes = size_t{64} << 20, kMaxBytes = size_t{64} << 30;
constexpr size_t kChunk = size_t{1} << 20;  // work unit: 1 MiB, many per thread so a slow thread costs little
constexpr size_t kPage = 4096;

// XOR of every 32-byte vector of [p, p + n): a result the compiler must compute, and 4 independent
// streams of loads per iteration so the loop is limited by memory, not by a dependency chain.
__m256i xor_chunk(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 128) {
    a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  return _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
}
}  // namespace

BandwidthResult measure_read_bandwidth(size_t bytes, int passes, size_t job_bytes) {
  if (bytes < kMinBytes || bytes > kMaxBytes)
    throw Error("memory bandwidth buffer: expected 64 MiB .. 64 GiB, got " + std::to_string(bytes >> 20) + " MiB");
  if (passes < 1) throw Error("memory bandwidth passes: expected >= 1, got " + std::to_string(passes));
  bytes = (bytes + kChunk - 1) / kChunk * kChunk;
  if (job_bytes != 0 && (job_bytes < kPage || job_bytes > bytes))
    throw Error("memory bandwidth job size: expected 4 KiB .. the buffer, got " + std::to_string(job_bytes) + " bytes");
  job_bytes = job_bytes == 0 ? bytes : job_bytes / kPage * kPage;
  auto free_aligned = [](uint8_t* p) { std::free(p); };
  std::unique_ptr<uint8_t, decltype(free_aligned)> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)), free_aligned);
  if (!buf) throw Error("memory bandwidth: cannot allocate " + std::to_string(bytes >> 20) + " MiB");
  ThreadPool& pool = ThreadPool::global();
  const int64_t chunks = static_cast<int64_t>(bytes / kChunk);
  pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) std::memset(buf.get() + i * kChunk, static_cast<int>(i & 0xff), kChunk);
  });
  // A job's work unit: 1 MiB for the whole buffer (many per thread, so a slow thread costs little), else about a
  // quarter of a thread's share, whole 128-byte lines (xor_chunk's step).
  const size_t unit = job_bytes == bytes ? kChunk
                                         : std::max<size_t>(128, job_bytes / (4 * static_cast<size_t>(pool.size())) / 128 * 128);
  std::atomic<uint64_t> sink{0};
  std::vector<double> gbs;
  for (int pass = -1; pass < passes; ++pass) {  // pass -1: warm-up (page tables, thread wake-up)
    const auto t0 = std::chrono::steady_clock::now();
    size_t read = 0;
    for (size_t j = 0; j + job_bytes <= bytes; j += job_bytes, read += job_bytes) {
      const uint8_t* job = buf.get() + j;
      const int64_t units = static_cast<int64_t>((job_bytes + unit - 1) / unit);
      pool.parallel_for(units, 1, [&](int64_t b, int64_t e, int) {
        __m256i acc = _mm256_setzero_si256();
        for (int64_t i = b; i < e; ++i) {
          const size_t at = static_cast<size_t>(i) * unit;
          acc = _mm256_xor_si256(acc, xor_chunk(job + at, std::min(unit, job_bytes - at)));
        }
        sink.fetch_xor(static_cast<uint64_t>(_mm256_extract_epi64(acc, 0)), std::memory_order_relaxed);
      });
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass >= 0) gbs.push_back(static_cast<double>(read) / s / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  BandwidthResult r;
  r.best_gb_s = gbs.back();
  r.median_gb_s = gbs[gbs.size() / 2];
  r.bytes = bytes;
  r.passes = passes;
  r.threads = pool.size();
  r.job_bytes = job_bytes == bytes ? 0 : job_bytes;
  (void)sink.load();
  return r;
}

}  // namespace k3::bench
