// MappedFile (io/mapped_file.h): the mapped and the read-into-memory views hold the same bytes; the read view is
// 2 MB aligned and read-only; empty and missing files behave the same way in both modes.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "k3/core/error.h"
#include "k3/io/mapped_file.h"
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

}  // namespace
