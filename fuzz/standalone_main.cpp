// Runs a libFuzzer-style harness (LLVMFuzzerTestOneInput) without libFuzzer, so every parser's fuzzer
// also runs in the ordinary (gcc, CI) build as a seeded mutation test: each seed file once, then --runs
// deterministic mutations of the seeds. A crash, sanitizer report or uncaught exception fails the test;
// the input that caused it is written to fuzz-crash-<name>-<run>.bin first (in $K3_FUZZ_CRASH_DIR or the
// working directory), so it can be replayed: `fuzz_x file`.
// Long by-hand runs use the real libFuzzer build instead (cmake -DK3_FUZZ=ON with clang; docs/security.md).
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" __attribute__((weak)) void __sanitizer_set_death_callback(void (*)(void));

namespace {

std::vector<uint8_t> g_current;  // the input under test, saved on a crash
std::string g_name = "fuzz";
long g_run = -1;

void save_current() {
  const char* dir = std::getenv("K3_FUZZ_CRASH_DIR");
  const std::string path = std::string(dir ? dir : ".") + "/fuzz-crash-" + g_name + "-" + std::to_string(g_run) + ".bin";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(g_current.data(), 1, g_current.size(), f);
    std::fclose(f);
    std::fprintf(stderr, "fuzz: crashing input (%zu bytes) written to %s\n", g_current.size(), path.c_str());
  }
}

void on_signal(int sig) {
  save_current();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Values that break parsers: boundaries of integer and float ranges, structure characters, long runs.
const char* const kTokens[] = {"0", "-1", "4294967296", "9223372036854775807", "-9223372036854775808",
                               "18446744073709551616", "1e308", "1e309", "-1e400", "1e-45", "NaN", "nan",
                               "Infinity", "null", "true", "\"\"", "[]", "{}", "\\u0000", "\\ud800", "\xff",
                               "\xc0\x80", "\xed\xa0\x80", "\r\n", "\n", " ", "\"", ":", ",", "{", "}", "[", "]"};

std::vector<uint8_t> mutate(const std::vector<std::vector<uint8_t>>& seeds, std::mt19937_64& rng, size_t max_len) {
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  std::vector<uint8_t> d = seeds[pick(seeds.size())];
  const int steps = 1 + int(rng() % 4);
  for (int s = 0; s < steps; ++s) {
    const size_t pos = pick(d.size() + 1);
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!d.empty()) d[pick(d.size())] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1:  // a random byte
        if (!d.empty()) d[pick(d.size())] = uint8_t(rng());
        break;
      case 2: {  // insert random bytes
        const size_t n = 1 + pick(16);
        for (size_t i = 0; i < n; ++i) d.insert(d.begin() + std::ptrdiff_t(std::min(pos, d.size())), uint8_t(rng()));
        break;
      }
      case 3: {  // delete a range
        if (d.empty()) break;
        const size_t n = 1 + pick(std::min<size_t>(d.size() - std::min(pos, d.size() - 1), 64));
        const size_t p = std::min(pos, d.size() - 1);
        d.erase(d.begin() + std::ptrdiff_t(p), d.begin() + std::ptrdiff_t(std::min(d.size(), p + n)));
        break;
      }
      case 4: {  // insert a token that breaks parsers
        const char* t = kTokens[pick(std::size(kTokens))];
        d.insert(d.begin() + std::ptrdiff_t(pos), t, t + std::strlen(t));
        break;
      }
      case 5: {  // replace a run of digits (or anything) with a boundary number
        const char* t = kTokens[pick(9)];
        const size_t n = std::min(d.size() - std::min(pos, d.size()), size_t(1 + pick(8)));
        d.erase(d.begin() + std::ptrdiff_t(pos), d.begin() + std::ptrdiff_t(pos + n));
        d.insert(d.begin() + std::ptrdiff_t(pos), t, t + std::strlen(t));
        break;
      }
      case 6: {  // duplicate a range (long repeats)
        if (d.empty()) break;
        const size_t p = pick(d.size());
        const size_t n = 1 + pick(std::min<size_t>(d.size() - p, 32));
        const std::vector<uint8_t> piece(d.begin() + std::ptrdiff_t(p), d.begin() + std::ptrdiff_t(p + n));
        const size_t reps = 1 + pick(64);
        for (size_t r = 0; r < reps && d.size() + n <= max_len; ++r)
          d.insert(d.begin() + std::ptrdiff_t(p), piece.begin(), piece.end());
        break;
      }
      default: {  // splice in part of another seed
        const auto& o = seeds[pick(seeds.size())];
        if (o.empty()) break;
        const size_t p = pick(o.size());
        const size_t n = 1 + pick(o.size() - p);
        d.insert(d.begin() + std::ptrdiff_t(pos), o.begin() + std::ptrdiff_t(p), o.begin() + std::ptrdiff_t(p + n));
        break;
      }
    }
    if (d.size() > max_len) d.resize(max_len);
  }
  return d;
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void run_one(const std::vector<uint8_t>& d) {
  g_current = d;
  LLVMFuzzerTestOneInput(g_current.data(), g_current.size());
}

}  // namespace

int main(int argc, char** argv) {
  g_name = std::filesystem::path(argv[0]).filename().string();
  long runs = 500;
  uint64_t seed = 1;
  size_t max_len = 1 << 16;
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) runs = std::atol(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--max-len" && i + 1 < argc) max_len = std::strtoull(argv[++i], nullptr, 10);
    else inputs.emplace_back(a);
  }
  if (const char* r = std::getenv("K3_FUZZ_RUNS")) runs = std::atol(r);  // the longer by-hand mode
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::signal(SIGSEGV, on_signal);
  std::signal(SIGABRT, on_signal);
  std::signal(SIGBUS, on_signal);
  std::signal(SIGFPE, on_signal);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(save_current);
  std::set_terminate([] {
    save_current();
    std::fprintf(stderr, "fuzz: uncaught exception (a harness must catch the errors its parser documents)\n");
    std::abort();
  });

  std::vector<std::vector<uint8_t>> seeds;
  for (const auto& in : inputs) {
    if (std::filesystem::is_directory(in)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(in))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // a fixed order: the same seed gives the same runs
      for (const auto& f : files) seeds.push_back(read_file(f));
    } else {
      seeds.push_back(read_file(in));
    }
  }
  if (seeds.empty()) seeds.emplace_back();
  for (const auto& s : seeds) run_one(s);
  std::mt19937_64 rng(seed);
  for (g_run = 0; g_run < runs; ++g_run) run_one(mutate(seeds, rng, max_len));
  std::printf("%s: %zu seeds + %ld mutations (seed %llu), no crash\n", g_name.c_str(), seeds.size(), runs,
              static_cast<unsigned long long>(seed));
  return 0;
}
