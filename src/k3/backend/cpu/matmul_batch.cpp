// matmul_batch and matmul_two_stage (ops.h): many small matmuls -- a token's routed experts, each a few hundred
// KB of weights, i.e. microseconds of memory traffic -- in ONE fork-join of the thread pool.
//
// A tier that converts the activations once per call (RowKernels::prepare / rows: avx512bf16's bf16 pairs and
// int8 quads) gets each job's tokens converted once, and its row blocks run on them; driven through dot / gemm
// it would convert them again for every row (a third of its decode time). Jobs with the same input and the same
// conversion (an expert's gate and up) share one converted copy. A token's conversion is the same code whatever
// range or thread converts it and a row's result does not depend on its block, so every output has matmul's bits --
// except a job whose MXFP4 matrix has the CPU's copy (mxfp4_rowblocks.h: routed experts, made by
// add_expert_decode_layouts): it reads the copy, with that product's conversion (one int8 scale per 32 values, not the
// tier's per 4) and its bits -- the same for a token whatever the job's token count.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <vector>

#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/thread_pool.h"

namespace k3::cpu {

namespace {

// The converted activations of a batch, one buffer per calling thread that grows to the largest call and is
// reused (fresh vectors per job cost a zero-fill and page faults on every MoE layer: ~32 MB per layer at pp512
// on kl-1b). Separate from act_path's scratch, which dot / gemm / matmul use.
uint8_t* batch_act_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

struct Conversion {
  const float* x;
  int64_t n, cols;
  void (*prepare)(const float*, int64_t, int64_t, uint8_t*);
  int64_t stride;  // bytes per converted token
  size_t offset;   // into the scratch buffer
  int group;       // matmul_two_stage: the group whose second-stage input this is (-1: first stage)
};

using RowsFn = void (*)(const WeightMatrix&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t);

struct ConvPlan {
  std::vector<Conversion> convs;
  std::vector<size_t> conv_of;  // per job (first stage, then second): its conversion, SIZE_MAX if none
  std::vector<RowsFn> rows_of;  // per job: the rows over its conversion
  size_t total = 0;             // scratch bytes
};

// How a job's tokens are converted and its rows run on them: the copy's product for a job whose matrix has one, else
// the tier's (prepare null: the tier converts per row itself).
struct JobKernels {
  void (*prepare)(const float*, int64_t, int64_t, uint8_t*);
  int64_t stride;  // bytes per converted token
  RowsFn rows;
};
JobKernels job_kernels(const MatmulJob& j) {
  if (mxfp4_rowblocks_job(*j.W, j.n))
    return {mxfp4_rowblocks_prepare, mxfp4_rowblocks_act_bytes(j.W->cols), mxfp4_rowblocks_rows};
  const RowKernels& k = row_kernels(j.W->format);
  return {k.prepare, k.prepare ? k.act_bytes(j.W->cols, 1) : 0, k.rows};
}

// Appends the conversions of `jobs` (sharing one where input, size and conversion agree, among those added
// by this call only) and each job's index into plan.conv_of.
void plan_conversions(std::span<const MatmulJob> jobs, std::span<const int> groups, ConvPlan& plan) {
  const size_t first = plan.convs.size();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    const JobKernels k = job_kernels(j);
    size_t c = SIZE_MAX;
    if (k.prepare && j.n > 0) {
      const int64_t cols = j.W->cols;
      for (size_t d = first; d < plan.convs.size() && c == SIZE_MAX; ++d)
        if (plan.convs[d].x == j.x && plan.convs[d].n == j.n && plan.convs[d].cols == cols && plan.convs[d].prepare == k.prepare)
          c = d;
      if (c == SIZE_MAX) {
        c = plan.convs.size();
        plan.convs.push_back({j.x, j.n, cols, k.prepare, k.stride, plan.total, groups.empty() ? -1 : groups[i]});
        plan.total += static_cast<size_t>(k.stride * j.n + 63) / 64 * 64;
      }
    }
    plan.conv_of.push_back(c);
    plan.rows_of.push_back(k.rows);
  }
}

// Runs conversions [c0, c1) of the plan, in pieces of at most 16 tokens over the threads when `parallel` (a few
// large conversions still spread out; serial they were ~2-4% of a prefill's wall time with 2 threads).
void convert(const ConvPlan& plan, size_t c0, size_t c1, uint8_t* base, bool parallel) {
  struct Piece {
    size_t conv;
    int64_t t0, t1;
  };
  std::vector<Piece> pieces;
  for (size_t c = c0; c < c1; ++c)
    for (int64_t t = 0; t < plan.convs[c].n; t += 16) pieces.push_back({c, t, std::min(plan.convs[c].n, t + 16)});
  parallel_for(static_cast<int64_t>(pieces.size()), parallel, [&](int64_t pi) {
    const Piece& p = pieces[static_cast<size_t>(pi)];
    const Conversion& cv = plan.convs[p.conv];
    cv.prepare(cv.x + p.t0 * cv.cols, p.t1 - p.t0, cv.cols, base + cv.offset + p.t0 * cv.stride);
  });
}

int64_t conversion_values(const ConvPlan& plan, size_t c0, size_t c1) {
  int64_t v = 0;
  for (size_t c = c0; c < c1; ++c) v += plan.convs[c].n * plan.convs[c].cols;
  return v;
}

struct Block {
  const MatmulJob* job;
  size_t job_index;  // into plan.conv_of
  int64_t r0, r1;
};

int64_t weight_bytes(std::span<const MatmulJob> jobs) {
  int64_t b = 0;
  for (const MatmulJob& j : jobs) b += j.W->bytes() * std::max<int64_t>(j.n, 1);
  return b;
}

// Rows of each job in blocks of about `target` bytes (at least 16 rows: a block amortises its hand-out).
void cut_blocks(std::span<const MatmulJob> jobs, size_t job_base, int64_t target, std::vector<Block>& out) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    if (j.n <= 0 || j.W->rows <= 0) continue;
    const int64_t row_bytes = std::max<int64_t>(j.W->bytes() / j.W->rows * j.n, 1);
    int64_t rows_per = std::clamp<int64_t>(target / row_bytes, 16, j.W->rows);
    if (mxfp4_rowblocks_job(*j.W, j.n)) rows_per = (rows_per + 15) / 16 * 16;  // whole 16-row blocks of the copy
    for (int64_t r = 0; r < j.W->rows; r += rows_per) out.push_back({&j, job_base + i, r, std::min(j.W->rows, r + rows_per)});
  }
}

void run_block(const Block& bl, const ConvPlan& plan, const uint8_t* base) {
  const MatmulJob& j = *bl.job;
  const size_t c = plan.conv_of[bl.job_index];
  if (c != SIZE_MAX)
    return plan.rows_of[bl.job_index](*j.W, bl.r0, bl.r1, base + plan.convs[c].offset, j.n, j.y + bl.r0, j.W->rows);
  const RowKernels& k = row_kernels(j.W->format);
  if (j.n == 1)
    for (int64_t r = bl.r0; r < bl.r1; ++r) j.y[r] = k.dot(*j.W, r, j.x);
  else
    k.gemm(*j.W, bl.r0, bl.r1, j.x, j.n, j.y);
}

// ~8 blocks per thread: enough for the dynamic hand-out to even out a slow thread, few enough that a block
// amortises its hand-out (one atomic add). K3_BATCH_BLOCKS_PER_THREAD=N (1..64): the A/B knob of the 16-thread
// measurement (longer blocks are longer sequential streams for the hardware prefetcher; same bits).
int blocks_per_thread() {
  static const int v = [] {
    const char* e = std::getenv("K3_BATCH_BLOCKS_PER_THREAD");
    const long n = e ? std::strtol(e, nullptr, 10) : 0;
    return n >= 1 && n <= 64 ? static_cast<int>(n) : 8;
  }();
  return v;
}
int64_t block_target(int64_t total_bytes) {
  return std::max<int64_t>(total_bytes / (blocks_per_thread() * static_cast<int64_t>(ThreadPool::global().size())), 1);
}

}  // namespace

void matmul_batch(std::span<const MatmulJob> jobs) {
  ConvPlan plan;
  plan_conversions(jobs, {}, plan);
  uint8_t* base = plan.convs.empty() ? nullptr : batch_act_scratch(plan.total);
  convert(plan, 0, plan.convs.size(), base, conversion_values(plan, 0, plan.convs.size()) > 65536);
  const int64_t total_bytes = weight_bytes(jobs);
  std::vector<Block> blocks;
  cut_blocks(jobs, 0, block_target(total_bytes), blocks);
  auto run = [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) run_block(blocks[static_cast<size_t>(b)], plan, base);
  };
  if (total_bytes > 32768 * 2)
    ThreadPool::global().parallel_for(static_cast<int64_t>(blocks.size()), 1, run);
  else
    run(0, static_cast<int64_t>(blocks.size()), 0);
}

// One fork-join for two dependent stages. Every first-stage block is handed out before any second-stage one
// (the pool's first_stage split; each thread streams its own run of blocks within a stage). The thread finishing a group's last first-stage
// block runs between(g) and converts that group's second-stage inputs, then marks the group ready; a
// second-stage block spins until its group is ready. No deadlock: when a thread holds a second-stage block,
// every first-stage block has been claimed by a running thread, and first-stage blocks never wait.
void matmul_two_stage(std::span<const MatmulJob> first, std::span<const int> first_group, std::span<const MatmulJob> second,
                      std::span<const int> second_group, int groups, const std::function<void(int)>& between) {
  ConvPlan plan;
  plan_conversions(first, {}, plan);
  const size_t first_convs = plan.convs.size();
  plan_conversions(second, second_group, plan);
  uint8_t* base = plan.convs.empty() ? nullptr : batch_act_scratch(plan.total);
  convert(plan, 0, first_convs, base, conversion_values(plan, 0, first_convs) > 65536);
  const int64_t total_bytes = weight_bytes(first) + weight_bytes(second);
  const int64_t target = block_target(total_bytes);
  std::vector<Block> blocks;
  cut_blocks(first, 0, target, blocks);
  const size_t n_first = blocks.size();
  cut_blocks(second, first.size(), target, blocks);
  std::vector<std::atomic<int64_t>> remaining(static_cast<size_t>(groups));
  std::vector<std::atomic<int>> ready(static_cast<size_t>(groups));
  for (auto& r : remaining) r.store(0, std::memory_order_relaxed);
  for (auto& r : ready) r.store(0, std::memory_order_relaxed);
  for (size_t b = 0; b < n_first; ++b) remaining[static_cast<size_t>(first_group[blocks[b].job_index])].fetch_add(1, std::memory_order_relaxed);
  auto finish_group = [&](int g) {
    between(g);
    for (size_t c = first_convs; c < plan.convs.size(); ++c)
      if (plan.convs[c].group == g) convert(plan, c, c + 1, base, false);
    ready[static_cast<size_t>(g)].store(1, std::memory_order_release);
  };
  for (int g = 0; g < groups; ++g)  // a group without first-stage rows (no tokens) is ready at once
    if (remaining[static_cast<size_t>(g)].load(std::memory_order_relaxed) == 0) finish_group(g);
  std::atomic<bool> failed{false};  // a throwing block: waiters must not spin on a group that never finishes
  auto run = [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const Block& bl = blocks[static_cast<size_t>(b)];
      try {
        if (static_cast<size_t>(b) < n_first) {
          run_block(bl, plan, base);
          const int g = first_group[bl.job_index];
          if (remaining[static_cast<size_t>(g)].fetch_sub(1, std::memory_order_acq_rel) == 1) finish_group(g);
        } else {
          const auto& r = ready[static_cast<size_t>(second_group[bl.job_index - first.size()])];
          while (r.load(std::memory_order_acquire) == 0) {
            if (failed.load(std::memory_order_relaxed)) throw std::runtime_error("matmul_two_stage: a first-stage block failed");
            _mm_pause();
          }
          run_block(bl, plan, base);
        }
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        throw;
      }
    }
  };
  if (total_bytes > 32768 * 2)  // every first-stage block claimed before any second-stage one: no deadlock
    ThreadPool::global().parallel_for(static_cast<int64_t>(blocks.size()), 1, run, ThreadPool::Claim::Spread,
                                      static_cast<int64_t>(n_first));
  else
    run(0, static_cast<int64_t>(blocks.size()), 0);
}

}  // namespace k3::cpu
