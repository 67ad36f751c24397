#include "cli/expert_report.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "k3/core/error.h"
#include "k3/io/page_cache.h"

namespace k3cli {

namespace fs = std::filesystem;

int64_t peak_rss_bytes() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

std::string expert_cache_report(const std::optional<k3::ExpertCacheStats>& now, const k3::DiskCounters& since,
                                double seconds) {
  char buf[768];
  std::string o;
  if (now && now->enabled) {
    const auto& s = *now;
    std::snprintf(buf, sizeof buf,
                  "expert cache: hit ratio %.3f (%lld of %lld expert uses resident), %.2f GB of %.2f GB needed were "
                  "not resident; prefetch %s (%lld experts); pinned %lld experts, %.2f GB of a %.2f GB budget%s; "
                  "%lld experts, %.2f GB in all\n",
                  s.hit_ratio(), (long long)s.hits, (long long)s.lookups, double(s.missing_bytes) / 1e9,
                  double(s.needed_bytes) / 1e9, s.prefetch.c_str(), (long long)s.prefetched_experts,
                  (long long)s.hot_experts, double(s.hot_bytes) / 1e9, double(s.hot_budget_bytes) / 1e9,
                  s.pinning || s.hot_budget_bytes == 0 ? "" : " (mlock refused: not pinned)", (long long)s.experts_total,
                  double(s.expert_bytes_total) / 1e9);
    o += buf;
  }
  const k3::DiskCounters d = k3::read_disk_counters();
  if (d.read_bytes >= 0 && since.read_bytes >= 0) {
    const double gb = double(d.read_bytes - since.read_bytes) / 1e9;
    std::snprintf(buf, sizeof buf, "disk: read %.2f GB from storage", gb);
    o += buf;
    if (seconds > 0) {
      std::snprintf(buf, sizeof buf, " in %.2f s (%.3f GB/s)", seconds, gb / seconds);
      o += buf;
    }
  } else {
    o += "disk: /proc/self/io not readable";
  }
  std::snprintf(buf, sizeof buf, ", %lld major faults; peak RSS %.2f GB\n", (long long)(d.major_faults - since.major_faults),
                double(peak_rss_bytes()) / 1e9);
  return o + buf;
}

void drop_checkpoint_pages(const std::string& dir) {
  std::error_code ec;
  int64_t dropped = 0, files = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().extension() == ".safetensors") {
      dropped += k3::evict_file_pages(it->path().string());
      ++files;
    }
  std::fprintf(stderr, "k3: evicted %lld safetensors files from the page cache (%.2f GB were resident)\n",
               (long long)files, double(dropped) / 1e9);
}

void add_bench_disk(CLI::App* bench, Registry& reg) {
  struct DiskOpts {
    std::vector<std::string> files;
    double gb = 4, block_mb = 4;
    bool drop = false;
  };
  auto o = std::make_shared<DiskOpts>();
  auto* d = bench->add_subcommand("disk", "Read bandwidth of the storage under FILE (O_DIRECT: page cache bypassed)");
  d->add_option("files", o->files, "files to read (e.g. the checkpoint's shards)")->required();
  d->add_option("--gb", o->gb, "GB to read per file and pattern at most")->check(CLI::Range(0.001, 1e6))->capture_default_str();
  d->add_option("--block-mb", o->block_mb, "MB per read (rounded down to 4 KiB)")->check(CLI::Range(0.004, 1024.0))->capture_default_str();
  d->add_flag("--drop", o->drop, "only evict the files from the page cache (posix_fadvise DONTNEED), no reads");
  d->callback([&reg, o] {
    reg.action = [o] {
      for (const std::string& f : o->files) {
        if (o->drop) {
          const int64_t was = k3::evict_file_pages(f);
          std::printf("%s: evicted (%.2f GB were resident, %.2f GB now)\n", f.c_str(), double(was) / 1e9,
                      double(k3::resident_file_bytes(f)) / 1e9);
          continue;
        }
        const int64_t block = static_cast<int64_t>(o->block_mb * 1e6) / 4096 * 4096;
        const int64_t max_bytes = static_cast<int64_t>(o->gb * 1e9);
        for (bool random : {false, true}) {
          const k3::DiskReadResult r = k3::measure_disk_read(f, max_bytes, block, random);
          std::printf("%s: %s reads of %.2f MB%s: %.2f GB in %.2f s = %.3f GB/s\n", f.c_str(),
                      random ? "random" : "sequential", double(block) / 1e6, r.direct ? " (O_DIRECT)" : " (buffered, evicted first)",
                      double(r.bytes) / 1e9, r.seconds, r.gbps());
        }
      }
      return 0;
    };
  });
}

}  // namespace k3cli
