// MappedFile (io/mapped_file.h): the mapped and the read-into-memory views hold the same bytes; the read view is
// 2 MB aligned and read-only; empty and missing files behave the same way in both modes; release gives the whole
// pages of a range back to the system while its bytes stay readable and unchanged.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <random>
#include <vector>

#include "k3/core/error.h"
#include "k3/io/mapped_file.h"
#include "process_pages.h"
#include "test_util.h"

namespace {

struct ModeScope {  // the process-wide mode for one test, restored after
  explicit ModeScope(k3::FileLoad m) { k3::set_file_load(m); }
  ~ModeScope() { k3::set_file_load(k3::FileLoad::Mmap); }
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

TEST(MappedFile, ReadAndMappedViewsHoldTheSameBytes) {
  k3test::TempDir t;
  std::mt19937 rng(3);
  for (size_t n : {size_t{1}, size_t{4095}, (size_t{3} << 20) + 17}) {
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const std::string path = (t.path / ("f" + std::to_string(n))).string();
    write_file(path, bytes);
    const k3::MappedFile mapped(path);
    ModeScope read_mode(k3::FileLoad::Read);
    const k3::MappedFile copy(path);
    ASSERT_EQ(mapped.size(), n);
    ASSERT_EQ(copy.size(), n);
    EXPECT_EQ(std::memcmp(mapped.data(), bytes.data(), n), 0);
    EXPECT_EQ(std::memcmp(copy.data(), bytes.data(), n), 0);
    EXPECT_NE(copy.data(), mapped.data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % (size_t{2} << 20), 0u) << "offered to 2 MB pages";
    // Read-only like the mapping: a stray write faults.
    volatile uint8_t* w = const_cast<uint8_t*>(copy.data());
    EXPECT_DEATH(w[n - 1] = 1, "");
  }
}

TEST(MappedFile, EmptyAndMissingFilesInBothModes) {
  k3test::TempDir t;
  const std::string empty = (t.path / "empty").string();
  write_file(empty, {});
  for (k3::FileLoad m : {k3::FileLoad::Mmap, k3::FileLoad::Read}) {
    ModeScope scope(m);
    const k3::MappedFile f(empty);
    EXPECT_EQ(f.size(), 0u);
    EXPECT_EQ(f.data(), nullptr);
    const std::string missing = (t.path / "missing").string();
    try {
      const k3::MappedFile g(missing);
      ADD_FAILURE() << "no error for a missing file";
    } catch (const k3::Error& e) {
      EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(k3::file_load(), k3::FileLoad::Mmap);
}

// Random bytes, never 0: a page that came back zero-filled (lost, not re-read) cannot pass for the file's.
std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(1 + rng() % 255);
  return b;
}

const char* mode_name(k3::FileLoad m) { return m == k3::FileLoad::Read ? "read" : "mmap"; }

// Touches every page of the view, then reports which pages of it this process holds.
std::vector<bool> touched_pages(const k3::MappedFile& f) {
  volatile uint8_t sink = 0;
  for (size_t o = 0; o < f.size(); o += k3test::page_size()) sink = sink + f.data()[o];
  (void)sink;
  return k3test::pages_present(f.data(), (f.size() + k3test::page_size() - 1) / k3test::page_size());
}

// A file of n random bytes, then fn(view, bytes) with the file mapped and with it read into memory (each traced).
template <class F>
void for_each_view(size_t n, unsigned seed, F&& fn) {
  k3test::TempDir t;
  const std::vector<uint8_t> bytes = random_bytes(n, seed);
  const std::string path = (t.path / "f").string();
  write_file(path, bytes);
  for (k3::FileLoad m : {k3::FileLoad::Mmap, k3::FileLoad::Read}) {
    SCOPED_TRACE(mode_name(m));
    ModeScope scope(m);
    const k3::MappedFile f(path);
    ASSERT_EQ(f.in_memory(), m == k3::FileLoad::Read);
    fn(f, bytes);
  }
}

// An interior unaligned range: its whole pages leave the process (pagemap, and the smaps Rss of the mappings over
// them), its partial end pages and the rest stay, and every byte still reads as the file's -- in both modes. The
// read mode's released range becomes a mapping of the file itself.
TEST(MappedFile, ReleaseGivesBackWholePagesAndKeepsTheBytes) {
  const size_t pg = k3test::page_size(), n = 9 * pg + 1234;
  for_each_view(n, 5, [&](const k3::MappedFile& f, const std::vector<uint8_t>& bytes) {
    for (bool b : touched_pages(f)) ASSERT_TRUE(b) << "a touched page is not present: the check below would prove nothing";
    const uintptr_t base = reinterpret_cast<uintptr_t>(f.data());
    const auto rss_before = k3test::vmas_overlapping(base, base + n);
    // [pg + 100, 6 pg + 50): pages 2..5 are whole inside it, pages 1 and 6 partly.
    EXPECT_EQ(f.release(f.data() + pg + 100, 5 * pg - 50), 4 * pg);
    const std::vector<bool> present = k3test::pages_present(f.data(), 10);
    for (size_t i = 0; i < 10; ++i) EXPECT_EQ(present[i], i < 2 || i > 5) << "page " << i;
    int64_t before_kb = 0, after_kb = 0;
    for (const auto& v : rss_before) before_kb += v.rss_kb;
    for (const auto& v : k3test::vmas_overlapping(base, base + n)) {
      after_kb += v.rss_kb;
      if (v.lo >= base + 2 * pg && v.hi <= base + 6 * pg) {  // read mode: the released range's own mapping
        EXPECT_EQ(v.rss_kb, 0);
        EXPECT_NE(v.file.find("/f"), std::string::npos) << "not a mapping of the file: '" << v.file << "'";
      }
    }
    EXPECT_EQ(before_kb - after_kb, static_cast<int64_t>(4 * pg / 1024)) << "smaps Rss of the view's mappings";
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), n), 0);
  });
}

// n = 0 (any pointer), a range inside one page, a range smaller than a page across a page boundary, a part of the
// last page: nothing released. A range holding all of the file's last, partial page releases it. Outside the view:
// throws.
TEST(MappedFile, ReleaseEdgeCases) {
  const size_t pg = k3test::page_size(), n = 4 * pg + 700;
  for_each_view(n, 7, [&](const k3::MappedFile& f, const std::vector<uint8_t>& bytes) {
    touched_pages(f);
    EXPECT_EQ(f.release(nullptr, 0), 0u);
    EXPECT_EQ(f.release(f.data() + n, 0), 0u);
    EXPECT_EQ(f.release(f.data() + 10, pg - 20), 0u);
    EXPECT_EQ(f.release(f.data() + pg - 10, 20), 0u);
    for (bool b : k3test::pages_present(f.data(), 5)) EXPECT_TRUE(b);
    EXPECT_EQ(f.release(f.data() + n - 10, 10), 0u) << "a part of the last page";
    for (bool b : k3test::pages_present(f.data(), 5)) EXPECT_TRUE(b);
    EXPECT_EQ(f.release(f.data() + 4 * pg, n - 4 * pg), pg) << "the last page: all of its bytes, partial in the file";
    EXPECT_EQ(f.release(f.data() + 2 * pg + 1, n - 2 * pg - 1), 2 * pg) << "page 3, and page 4 again";
    const std::vector<bool> present = k3test::pages_present(f.data(), 5);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(present[i], i < 3) << "page " << i;
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), n), 0);
    EXPECT_THROW(f.release(f.data() + n - 5, 10), k3::Error);
    EXPECT_THROW(f.release(f.data() - 1, 2), k3::Error);
  });
}

// Read into memory, the copy is the only right bytes once the file changed or went: then nothing is released.
TEST(MappedFile, ReleaseKeepsTheReadCopyOfAChangedOrMissingFile) {
  k3test::TempDir t;
  const size_t pg = k3test::page_size(), n = 6 * pg;
  const std::vector<uint8_t> bytes = random_bytes(n, 9);
  const std::string path = (t.path / "f").string();
  ModeScope scope(k3::FileLoad::Read);
  for (int change = 0; change < 3; ++change) {
    write_file(path, bytes);
    const k3::MappedFile f(path);
    std::vector<uint8_t> other = random_bytes(n, 11);
    if (change == 0) {  // same size, new bytes, later mtime
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      write_file(path, other);
    } else if (change == 1) {
      other.resize(n + 1);
      write_file(path, other);
    } else {
      std::filesystem::remove(path);
    }
    EXPECT_EQ(f.release(f.data() + pg, 3 * pg), 0u) << "change " << change;
    for (bool b : k3test::pages_present(f.data(), 6)) EXPECT_TRUE(b) << "change " << change;
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), n), 0) << "change " << change;
  }
}

}  // namespace
