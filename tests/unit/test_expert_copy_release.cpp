// The CPU's copies of the MXFP4 routed experts replace their stored bytes (backend/cpu/decode_layout.h,
// Model::add_decode_layouts): each layer's stored experts' pages are released once its copies are written. Releasing
// must change no result (the products read the copies only, and the released bytes stay readable anyway), the stored
// pages must leave the process and stay out of it through prefill and decode (nothing reads them), and the expert
// residency, which would read them back in, must let go of the copied experts -- with the checkpoint mapped and read
// into memory (--no-mmap).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <sys/mman.h>

#include "golden_util.h"
#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/io/mapped_file.h"
#include "k3/model/model.h"
#include "process_pages.h"
#include "test_util.h"

namespace {

struct LoadScope {  // the process-wide file mode and forced copies for one load, restored after
  explicit LoadScope(k3::FileLoad m, const char* copies) {
    k3::set_file_load(m);
    setenv("K3_CPU_MXFP4_ROWBLOCKS", copies, 1);
  }
  ~LoadScope() {
    k3::set_file_load(k3::FileLoad::Mmap);
    unsetenv("K3_CPU_MXFP4_ROWBLOCKS");
  }
};

std::unique_ptr<k3::Model> load_tiny(k3::FileLoad mode, bool copies, bool release) {
  LoadScope scope(mode, copies ? "1" : "0");
  auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  m->add_decode_layouts(true, release);
  return m;
}

// Linux maps the page-cache pages around a faulting address too ("fault-around": the aligned 64 KB window, the
// default fault_around_bytes): a read of a non-expert tensor whose page was reclaimed under memory pressure (CI runs
// the tests side by side) can map released expert pages that share its window, without anything reading them. The
// released checks count only the pages of 64 KB blocks that lie wholly inside the experts' bytes, which only a read of
// expert bytes can bring back.
constexpr uintptr_t kFaultAround = 64 * 1024;

// The stored experts' bytes (data and scales), each layer's joined: [begin, end) address ranges.
std::vector<std::pair<uintptr_t, uintptr_t>> stored_expert_ranges(const k3::Model& m) {
  std::vector<std::pair<uintptr_t, uintptr_t>> all;
  for (const auto& l : m.weights().layers) {
    std::vector<std::pair<uintptr_t, uintptr_t>> r;
    for (const auto& e : l.moe.experts)
      for (const k3::WeightMatrix* w : {&e.gate, &e.up, &e.down}) {
        const auto d = reinterpret_cast<uintptr_t>(w->data);
        r.emplace_back(d, d + static_cast<uintptr_t>(w->rows * k3::row_data_bytes(w->format, w->cols)));
        if (w->scales) {
          const auto s = reinterpret_cast<uintptr_t>(w->scales);
          r.emplace_back(s, s + static_cast<uintptr_t>(w->rows * k3::row_scale_bytes(w->format, w->cols)));
        }
      }
    std::sort(r.begin(), r.end());
    const size_t first = all.size();  // joined within the layer only: layers need not lie in address order
    for (const auto& x : r)
      if (all.size() > first && x.first <= all.back().second)
        all.back().second = std::max(all.back().second, x.second);
      else
        all.push_back(x);
  }
  return all;
}

// Present and all whole pages inside the stored experts' bytes; window > 0: only those in window-aligned blocks wholly
// inside.
std::pair<size_t, size_t> stored_expert_pages(const k3::Model& m, uintptr_t window = 0) {
  size_t present = 0, total = 0;
  const size_t pg = k3test::page_size();
  for (auto [a, b] : stored_expert_ranges(m)) {
    if (window > 0) {
      a = (a + window - 1) / window * window;
      b = b / window * window;
      if (b <= a) continue;
    }
    const auto* p = reinterpret_cast<const void*>(a);
    present += k3test::whole_pages_present(p, b - a);
    total += ((b / pg) > ((a + pg - 1) / pg)) ? b / pg - (a + pg - 1) / pg : 0;
  }
  return {present, total};
}

// Makes every whole page inside the stored experts' bytes unreadable (PROT_NONE): from then on a read of them kills
// the process with SIGSEGV. Returns the pages protected.
size_t protect_stored_experts(const k3::Model& m) {
  const size_t pg = k3test::page_size();
  size_t pages = 0;
  for (const auto& [a, b] : stored_expert_ranges(m)) {
    const uintptr_t lo = (a + pg - 1) / pg * pg, hi = b / pg * pg;
    if (lo >= hi) continue;
    if (::mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_NONE) != 0) return 0;
    pages += (hi - lo) / pg;
  }
  return pages;
}

// With copies, released or not: the same logits bit for bit, prefill and decode; released, the stored experts' pages
// are out of the process after the load and no forward reads them; kept, they are all in (the copies read every one of
// them). Both file modes.
TEST(ExpertCopyRelease, SameLogitsAndTheStoredPagesGoBack) {
  if (!k3::cpu::mxfp4_rowblocks_cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child runs the forwards: a fresh process, its own thread pool
  for (k3::FileLoad mode : {k3::FileLoad::Mmap, k3::FileLoad::Read}) {
    SCOPED_TRACE(mode == k3::FileLoad::Read ? "read" : "mmap");
    auto kept = load_tiny(mode, true, false), released = load_tiny(mode, true, true);
    ASSERT_GT(kept->expert_copy_bytes(), 0);
    ASSERT_EQ(released->expert_copy_bytes(), kept->expert_copy_bytes());
    EXPECT_EQ(kept->expert_released_bytes(), 0);
    const auto [kept_in, total] = stored_expert_pages(*kept);
    const auto [released_in, total2] = stored_expert_pages(*released);
    const auto [released_inner, inner] = stored_expert_pages(*released, kFaultAround);
    ASSERT_GT(total, 100u) << "k3-tiny's experts: ~6.9 MB";
    ASSERT_GT(inner, total / 2) << "most expert pages lie in whole 64 KB blocks";
    ASSERT_EQ(total2, total);
    EXPECT_EQ(kept_in, total) << "the kept stored experts were read for their copies";
    EXPECT_EQ(released_inner, 0u) << "stored expert pages still in the process after the release";
    EXPECT_LE(released_in, total - inner) << "released pages back beyond the fault-around windows at the edges";
    // Every whole page released, none outside (the file's last page at most: release's one exception).
    const auto pg = static_cast<int64_t>(k3test::page_size());
    EXPECT_GE(released->expert_released_bytes(), static_cast<int64_t>(total) * pg);
    EXPECT_LE(released->expert_released_bytes(), released->expert_copy_bytes() + pg);

    const int64_t V = kept->config().vocab_size;
    std::vector<int32_t> tokens(40);
    for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<int32_t>((t * 37 + 5) % (V - 300));
    const auto prefill = k3test::prefill_all_logits(*kept, tokens);
    const auto decode = k3test::decode_all_logits(*kept, tokens).logits;
    // Nothing reads the stored experts: with their whole pages unreadable the released model's forwards run to the
    // kept model's logits (a read would kill the child with SIGSEGV). Pages present after the forwards would not show
    // it: a fault on a neighbouring tensor may map a whole large page-cache folio (ext4 on Linux >= 6.16) that holds
    // expert pages, without anything reading them.
    EXPECT_EXIT(
        {
          if (protect_stored_experts(*released) < total) std::_Exit(3);
          if (k3test::prefill_all_logits(*released, tokens) != prefill) std::_Exit(4);
          if (k3test::decode_all_logits(*released, tokens).logits != decode) std::_Exit(5);
          std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "")
        << "3: pages not protected, 4 / 5: prefill / decode logits differ, SIGSEGV: a forward read the stored experts";
  }
}

// The expert residency (Model::load's default: on) manages the stored experts; once every expert is read from its
// copy it is gone (no stats: no file-backed experts), released or not; without copies it stays.
TEST(ExpertCopyRelease, ResidencyLetsGoOfCopiedExperts) {
  if (!k3::cpu::mxfp4_rowblocks_cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  EXPECT_FALSE(load_tiny(k3::FileLoad::Mmap, true, true)->expert_cache_stats().has_value());
  EXPECT_FALSE(load_tiny(k3::FileLoad::Mmap, true, false)->expert_cache_stats().has_value());
  auto none = load_tiny(k3::FileLoad::Mmap, false, true);
  EXPECT_EQ(none->expert_copy_bytes(), 0);
  ASSERT_TRUE(none->expert_cache_stats().has_value());
  EXPECT_GT(none->expert_cache_stats()->experts_total, 0);
  EXPECT_GT(none->expert_cache_stats()->expert_bytes_total, 0);
}

}  // namespace
