// Programmatic dependent launch (src/k3/backend/cuda/pdl.cuh): a pdl-launched GEMV may start while the kernel before
// it still runs, prefetching its weights; it must still read the activations that kernel writes. Here the kernel
// before it lets dependents start at once, then spins ~100 us and only then writes the activations: a GEMV (or its
// prep) that read x before its griddepcontrol.wait would see the old x. Eager launches and a captured graph.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "aux_kernels.h"
#include "quant_test_blocks.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/core/dtype.h"

namespace {

using k3::WeightFormat;
using namespace k3cudatest;
using namespace k3quanttest;

// fn's launches on st captured once as a CUDA graph (the decode step's form), replayed by launch().
struct CapturedGraph {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaStream_t st;
  CapturedGraph(cudaStream_t s, const std::function<void()>& fn) : st(s) {
    ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    fn();
    ck(cudaStreamEndCapture(st, &g), "end capture");
    ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  }
  ~CapturedGraph() {
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch() const { ck(cudaGraphLaunch(ge, st), "graph launch"); }
};

// us per projection of `chain` (count projections) replayed as a CUDA graph: run once eagerly (sizes any scratch
// outside the capture), captured, 3 warm replays, then the mean of 20.
double us_per_launch_of_graph(cudaStream_t st, const std::function<void()>& chain, int count) {
  chain();
  ck(cudaStreamSynchronize(st), "sync");
  const CapturedGraph graph(st, chain);
  for (int r = 0; r < 3; ++r) graph.launch();
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  const int reps = 20;
  ck(cudaEventRecord(a, st), "record");
  for (int r = 0; r < reps; ++r) graph.launch();
  ck(cudaEventRecord(b, st), "record");
  ck(cudaEventSynchronize(b), "sync");
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / (reps * count);
}

struct Case {
  WeightFormat f;
  int64_t rows, cols;
  int n;
};

// A device matrix of random blocks (and its bytes).
struct DevMatrix {
  std::vector<uint8_t> blocks;
  Dev<uint8_t> d;
  k3::WeightMatrix W;
  DevMatrix(WeightFormat f, int64_t rows, int64_t cols, uint32_t seed)
      : blocks(random_blocks(f, rows, cols, seed, 4, 10)), d(blocks), W(host_matrix(f, blocks, rows, cols)) {
    W.data = d.p;
    W.device = 0;
  }
};

// project() (which reads x and writes the ys) after a kernel that lets dependents start at once and writes the new x
// only ~100 us later: eager and as a captured graph, three times each, every y bit-equal to want (computed from the
// new x without a late writer). x holds the old values before each repetition.
void expect_reads_late_x(cudaStream_t st, Dev<float>& x, const Dev<float>& x_old, const Dev<float>& x_new,
                         const std::function<void()>& project, const std::vector<Dev<float>*>& ys,
                         const std::vector<std::vector<float>>& want) {
  auto late_then_project = [&] {
    ck(late_copy(x.p, x_new.p, static_cast<int64_t>(x.n), 200000, st), "late_copy");
    project();
  };
  auto check = [&](const char* how, int rep) {
    ck(cudaStreamSynchronize(st), "sync");
    for (size_t i = 0; i < ys.size(); ++i)
      EXPECT_EQ(std::memcmp(ys[i]->get().data(), want[i].data(), want[i].size() * 4), 0) << how << ", repetition " << rep << ", output " << i;
  };
  auto reset = [&] {
    ck(cudaMemcpy(x.p, x_old.p, x.n * 4, cudaMemcpyDeviceToDevice), "D2D");
    for (Dev<float>* y : ys) y->poison();
  };
  for (int rep = 0; rep < 3; ++rep) {
    reset();
    late_then_project();
    check("eager", rep);
  }
  const CapturedGraph graph(st, late_then_project);
  for (int rep = 0; rep < 3; ++rep) {
    reset();
    graph.launch();
    check("graph", rep);
  }
}

TEST(CudaPdl, ProjectionReadsTheActivationsItsPredecessorWritesLate) {
  SKIP_WITHOUT_GPU();
  const char* env = std::getenv("K3_PDL");
  const bool want_pdl = env == nullptr || std::strcmp(env, "0") != 0;
  ASSERT_EQ(pdl_enabled(), want_pdl) << "launches carry the attribute unless K3_PDL=0";
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  {
    k3::cuda::LinearRunner runner(st);
    // The one-token fp32 GEMV (v3: rows <= 4096 wide), the fp32 v2 / v1 (wider rows, 8 tokens of an fp32 format),
    // the tensor-core block GEMV after its prep (2..16 tokens; the tall head at one token), the Rows form (Q6_K, 8+).
    const Case cases[] = {{WeightFormat::Q4_K, 4096, 2304, 1},  {WeightFormat::Q6_K, 2304, 4096, 1},
                          {WeightFormat::Q6_K, 1024, 7168, 1},  {WeightFormat::Q6_K, 1024, 7168, 2},
                          {WeightFormat::Q8_0, 512, 2304, 8},
                          {WeightFormat::Q4_K, 4096, 2304, 4},  {WeightFormat::Q6_K, 70000, 256, 1},
                          {WeightFormat::Q6_K, 4096, 2304, 16}, {WeightFormat::Q5_K, 2304, 1024, 8}};
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(k3::weight_format_name(c.f)) + " " + std::to_string(c.rows) + " x " + std::to_string(c.cols) +
                   ", n = " + std::to_string(c.n));
      const DevMatrix M(c.f, c.rows, c.cols, 11 + static_cast<uint32_t>(c.rows));
      const size_t nx = static_cast<size_t>(c.n * c.cols), ny = static_cast<size_t>(c.n * c.rows);
      Dev<float> x_old(randn(nx, 3, 1.f)), x_new(randn(nx, 4, 1.f)), x(nx), y(ny), y_ref(ny);
      ck(cudaMemcpy(x.p, x_new.p, nx * 4, cudaMemcpyDeviceToDevice), "D2D");
      runner.run(M.W, x.p, c.n, y_ref.p);  // the reference: x already new (this also sizes the runner's scratch)
      ck(cudaStreamSynchronize(st), "sync");
      expect_reads_late_x(st, x, x_old, x_new, [&] { runner.run(M.W, x.p, c.n, y.p); }, {&y}, {y_ref.get()});
    }
  }
  cudaStreamDestroy(st);
}

// The grouped projections (LinearRunner::run_group over GGUF matrices): one v3 launch for several matrices at one
// token (4096 columns: XS; 2304: plain), and the shared prep of x before the tensor-core products at 4 and 16 tokens
// (one launch per matrix, or per format with K3_QUANT_MMA_GROUP=1).
TEST(CudaPdl, GroupedProjectionsReadTheActivationsTheirPredecessorWritesLate) {
  SKIP_WITHOUT_GPU();
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  for (const char* mma_group : {"0", "1"}) {  // the tensor-core products one launch each, or one per format
    const auto runner_p = k3cudatest::runner_with("K3_QUANT_MMA_GROUP", mma_group, st);
    k3::cuda::LinearRunner& runner = *runner_p;
    for (const int64_t cols : {int64_t{2304}, int64_t{4096}})
      for (const int n : {1, 4, 16}) {
        SCOPED_TRACE(std::to_string(cols) + " columns, n = " + std::to_string(n) + ", K3_QUANT_MMA_GROUP=" + mma_group);
        const DevMatrix A(WeightFormat::Q4_K, 4096, cols, 21), B(WeightFormat::Q4_K, 128, cols, 22),
            C(WeightFormat::Q6_K, 300, cols, 23), D(WeightFormat::Q6_K, 32, cols, 24);
        const k3::WeightMatrix* W[4] = {&A.W, &B.W, &C.W, &D.W};
        const size_t nx = static_cast<size_t>(n * cols);
        Dev<float> x_old(randn(nx, 5, 1.f)), x_new(randn(nx, 6, 1.f)), x(nx);
        std::vector<std::unique_ptr<Dev<float>>> y, y_ref;
        std::vector<float*> Y, Y_ref;
        std::vector<Dev<float>*> ys;
        for (const k3::WeightMatrix* w : W) {
          y.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n * w->rows)));
          y_ref.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(n * w->rows)));
          Y.push_back(y.back()->p);
          Y_ref.push_back(y_ref.back()->p);
          ys.push_back(y.back().get());
        }
        ck(cudaMemcpy(x.p, x_new.p, nx * 4, cudaMemcpyDeviceToDevice), "D2D");
        runner.run_group(W, Y_ref.data(), 4, x.p, n);
        ck(cudaStreamSynchronize(st), "sync");
        std::vector<std::vector<float>> want;
        for (auto& r : y_ref) want.push_back(r->get());
        expect_reads_late_x(st, x, x_old, x_new, [&] { runner.run_group(W, Y.data(), 4, x.p, n); }, ys, want);
      }
  }
  cudaStreamDestroy(st);
}

// The harness can fail: a pdl-launched kernel that reads x without waiting sees the old x while the predecessor spins
// (so the ordering test above would catch a GEMV or prep that read activations before pdl::wait()); with K3_PDL=0 it
// is an ordinary launch and sees the new x.
TEST(CudaPdl, AKernelThatDoesNotWaitReadsTooEarly) {
  SKIP_WITHOUT_GPU();
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  {
    const size_t n = 4096;
    const std::vector<float> old_h = randn(n, 5, 1.f), new_h = randn(n, 6, 1.f);
    Dev<float> x_old(old_h), x_new(new_h), x(n), out(n);
    // Both kernels launched once first: a kernel's first launch loads its module (lazy loading), which waits for the
    // device, so the early reader's first launch would not overlap anything (call s32-3).
    ck(late_copy(out.p, x_old.p, static_cast<int64_t>(n), 0, st), "warm late_copy");
    ck(early_read(out.p, x_old.p, static_cast<int64_t>(n), st), "warm early_read");
    ck(cudaStreamSynchronize(st), "sync");
    ck(cudaMemcpy(x.p, x_old.p, n * 4, cudaMemcpyDeviceToDevice), "D2D");
    ck(late_copy(x.p, x_new.p, static_cast<int64_t>(n), 2000000, st), "late_copy");  // ~1 ms
    ck(early_read(out.p, x.p, static_cast<int64_t>(n), st), "early_read");
    ck(cudaStreamSynchronize(st), "sync");
    const std::vector<float> got = out.get();
    if (pdl_enabled())
      EXPECT_EQ(std::memcmp(got.data(), old_h.data(), n * 4), 0) << "the early reader began after its predecessor wrote";
    else
      EXPECT_EQ(std::memcmp(got.data(), new_h.data(), n * 4), 0);
  }
  cudaStreamDestroy(st);
}

// Not a correctness test (filtered out with -*Timing*): us and GB/s per projection of a chain of `count` distinct
// one-token projections (127+ MB in all: no L2 reuse between them) replayed as a CUDA graph -- the fp32 GEMV the rule
// takes, the tensor-core kernel (K3_QUANT_MMA=1), and a plain 16-byte read of the same bytes per launch (the floor of a
// kernel of that size in a chain). Run it twice, with and without K3_PDL=0.
TEST(CudaPdl, TimingChainOfOneTokenProjections) {
  SKIP_WITHOUT_GPU();
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  std::printf("pdl %s\n", pdl_enabled() ? "on" : "off (K3_PDL=0)");
  const Case shapes[] = {{WeightFormat::Q4_K, 4096, 2304, 1}, {WeightFormat::Q4_K, 2304, 4096, 1},
                         {WeightFormat::Q6_K, 2304, 4096, 1}, {WeightFormat::Q4_K, 1024, 2304, 1}};
  for (const Case& c : shapes) {
    const auto wb = random_blocks(c.f, c.rows, c.cols, 21, 4, 10);
    const int count = static_cast<int>(std::max<size_t>(24, (size_t{128} << 20) / wb.size()));
    Dev<uint8_t> all(wb.size() * count);
    for (int i = 0; i < count; ++i) ck(cudaMemcpy(all.p + i * wb.size(), wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
    Dev<float> x(randn(static_cast<size_t>(c.cols), 7, 1.f)), y(static_cast<size_t>(c.rows) * count);
    Dev<uint32_t> sink(4096);
    auto time_graph = [&](const std::function<void()>& chain) { return us_per_launch_of_graph(st, chain, count); };
    for (const char* path : {"gemv", "q8", "mma", "read"}) {
      double us = 0;
      if (std::strcmp(path, "q8") == 0) {  // int8 activations (quant_gemv_q8.cu), where it runs
        if (!k3::cuda::quant_gemv_q8_supported(c.f, c.cols)) continue;
        us = time_graph([&] {
          for (int i = 0; i < count; ++i) {
            k3::WeightMatrix W = host_matrix(c.f, wb, c.rows, c.cols);
            W.data = all.p + i * wb.size();
            W.device = 0;
            ck(k3::cuda::quant_gemv(W, x.p, 1, y.p + static_cast<size_t>(c.rows) * i, st, k3::cuda::QuantGemvKernel::Q8), "q8");
          }
        });
      } else if (std::strcmp(path, "read") == 0) {
        const int blocks = static_cast<int>(std::min<int64_t>(4096, (c.rows + 7) / 8));
        us = time_graph([&] {
          for (int i = 0; i < count; ++i) ck(read_bytes(all.p + i * wb.size(), static_cast<int64_t>(wb.size() / 16 * 16), blocks, sink.p, st), "read");
        });
      } else {
        if (std::strcmp(path, "mma") == 0) ::setenv("K3_QUANT_MMA", "1", 1);
        k3::cuda::LinearRunner runner(st);
        ::unsetenv("K3_QUANT_MMA");
        us = time_graph([&] {
          for (int i = 0; i < count; ++i) {
            k3::WeightMatrix W = host_matrix(c.f, wb, c.rows, c.cols);
            W.data = all.p + i * wb.size();
            W.device = 0;
            runner.run(W, x.p, 1, y.p + static_cast<size_t>(c.rows) * i);
          }
        });
      }
      std::printf("%-5s %6lld x %5lld %-4s x%d: %7.2f us per projection, %6.0f GB/s\n", k3::weight_format_name(c.f),
                  static_cast<long long>(c.rows), static_cast<long long>(c.cols), path, count, us, wb.size() / us / 1e3);
    }
  }
  cudaStreamDestroy(st);
}

}  // namespace

namespace {

// Random bf16 weights, N(0, 0.05) rounded (never all zero).
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  const std::vector<float> v = randn(n, seed, 0.05f);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = k3::f32_to_bf16(v[i]);
  return b;
}

k3::WeightMatrix device_bf16(const uint16_t* p, int64_t rows, int64_t cols) {
  k3::WeightMatrix W{WeightFormat::BF16, p, nullptr, rows, cols, k3::kHostDevice};
  W.device = 0;
  return W;
}

}  // namespace

// The one-token bf16 GEMV's batched form (linear.cu gemv1_batch_kernel, the one-token rule since session 47) gives the loop form's bits at
// every batch cap, on widths that are whole 256-column chunks (2304, 4096, 7168), a part of one (128, 200) and not a
// multiple of a batch (2304 at caps 2, 4: 9 chunks), rows not a multiple of a block's 8; the loop form is held to
// float64 by the linear tests. Also pdl-launched after a late writer of x: the batched form waits too.
TEST(CudaPdl, Gemv1BatchFormGivesTheLoopFormsBits) {
  SKIP_WITHOUT_GPU();
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  using k3::cuda::Gemv1Form;
  const std::pair<int64_t, int64_t> shapes[] = {{37, 2304}, {256, 4096}, {100, 128}, {29, 7168}, {13, 200}, {9, 8}};
  for (const auto& [rows, cols] : shapes) {
    const std::vector<uint16_t> wb = random_bf16(static_cast<size_t>(rows * cols), 11 + cols);
    Dev<uint16_t> w(wb);
    const k3::WeightMatrix W = device_bf16(w.p, rows, cols);
    Dev<float> x(randn(static_cast<size_t>(cols), 5 + rows, 1.f)), y0(static_cast<size_t>(rows)), y1(static_cast<size_t>(rows));
    ck(k3::cuda::linear_gemv1_form(W, x.p, y0.p, st, Gemv1Form::Loop), "loop");
    const std::vector<float> want = (ck(cudaStreamSynchronize(st), "sync"), y0.get());
    double maxabs = 0;
    for (float v : want) maxabs = std::max(maxabs, static_cast<double>(std::fabs(v)));
    EXPECT_GT(maxabs, 0.0) << cols;
    for (int cap = 1; cap <= 9; ++cap) {
      ck(cudaMemset(y1.p, 0xff, static_cast<size_t>(rows) * 4), "poison");
      ck(k3::cuda::linear_gemv1_form(W, x.p, y1.p, st, Gemv1Form::Batch, cap), "batch");
      ck(cudaStreamSynchronize(st), "sync");
      const std::vector<float> got = y1.get();
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << rows << " x " << cols << " cap " << cap;
    }
    // After a kernel that writes x late: the batched form reads the new x.
    Dev<float> x_old(randn(static_cast<size_t>(cols), 99, 1.f)), x_new(x.get());
    ck(cudaMemcpy(x.p, x_old.p, static_cast<size_t>(cols) * 4, cudaMemcpyDeviceToDevice), "D2D");
    ck(late_copy(x.p, x_new.p, cols, 200000, st), "late_copy");
    ck(k3::cuda::linear_gemv1_form(W, x.p, y1.p, st, Gemv1Form::Batch), "batch after late writer");
    ck(cudaStreamSynchronize(st), "sync");
    const std::vector<float> late = y1.get();
    EXPECT_EQ(std::memcmp(late.data(), want.data(), want.size() * 4), 0) << rows << " x " << cols << " after a late writer";
  }
  EXPECT_EQ(k3::cuda::linear_gemv1_form(device_bf16(nullptr, 8, 12), nullptr, nullptr, st, Gemv1Form::Batch), cudaErrorInvalidValue);
  cudaStreamDestroy(st);
}

// Not a correctness test (filtered out with -*Timing*): us and GB/s per one-token bf16 projection in a graph of distinct
// matrices (Kimi-Linear-48B's shapes), the loop form against the batched form at caps 3, 5 and 9, and a plain read.
TEST(CudaPdl, TimingChainOfOneTokenBf16Projections) {
  SKIP_WITHOUT_GPU();
  using k3::cuda::Gemv1Form;
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 2304}, {2304, 4096}, {6144, 2304}, {576, 2304}, {4096, 128}};
  for (const auto& [rows, cols] : shapes) {
    const size_t bytes = static_cast<size_t>(rows * cols) * 2;
    const int count = static_cast<int>(std::max<size_t>(24, (size_t{256} << 20) / bytes));
    const std::vector<uint16_t> wb = random_bf16(static_cast<size_t>(rows * cols), 3);
    Dev<uint16_t> all(wb.size() * count);
    for (int i = 0; i < count; ++i) ck(cudaMemcpy(all.p + wb.size() * i, wb.data(), bytes, cudaMemcpyHostToDevice), "H2D");
    Dev<float> x(randn(static_cast<size_t>(cols), 7, 1.f)), y(static_cast<size_t>(rows) * count);
    Dev<uint32_t> sink(4096);
    auto time_graph = [&](const std::function<void()>& chain) { return us_per_launch_of_graph(st, chain, count); };
    struct Arm { const char* name; Gemv1Form form; int cap; };
    for (const Arm& arm : {Arm{"loop", Gemv1Form::Loop, 0}, Arm{"batch3", Gemv1Form::Batch, 3}, Arm{"batch5", Gemv1Form::Batch, 5},
                           Arm{"batch9", Gemv1Form::Batch, 9}, Arm{"read", Gemv1Form::Auto, -1}}) {
      double us = 0;
      if (arm.cap < 0) {
        const int blocks = static_cast<int>(std::min<int64_t>(4096, (rows + 7) / 8));
        us = time_graph([&] {
          for (int i = 0; i < count; ++i)
            ck(read_bytes(reinterpret_cast<const uint8_t*>(all.p) + i * bytes, static_cast<int64_t>(bytes), blocks, sink.p, st), "read");
        });
      } else {
        us = time_graph([&] {
          for (int i = 0; i < count; ++i)
            ck(k3::cuda::linear_gemv1_form(device_bf16(all.p + static_cast<size_t>(rows * cols) * i, rows, cols), x.p,
                                           y.p + static_cast<size_t>(rows) * i, st, arm.form, arm.cap),
               arm.name);
        });
      }
      std::printf("bf16 %6lld x %5lld %-6s x%d: %7.2f us per projection, %6.0f GB/s\n", static_cast<long long>(rows),
                  static_cast<long long>(cols), arm.name, count, us, bytes / us / 1e3);
    }
  }
  cudaStreamDestroy(st);
}
