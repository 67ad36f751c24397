#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
int main() {
  std::vector<unsigned char> v(1u << 30, 0x7f);
  for (size_t i = 0; i < v.size(); i += 4096) v[i] = (unsigned char)(i * 7 % 200);
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    auto t = std::chrono::steady_clock::now();
    const void* volatile h = std::memchr(v.data(), 0xFF, v.size());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    if (s < best) best = s;
    (void)h;
  }
  std::printf("memchr over 1 GiB resident: %.3f s -> %.1f GB/s\n", best, (1u << 30) / best / 1e9);
}
