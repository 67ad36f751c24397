// The GPU sampling kernel against the host reference sampling::sample_row (which tests/unit/
// test_sampler.cpp checks against float64 definitions): the same token, status and offending id for
// every row, on random logits of several vocab sizes and every parameter combination (greedy,
// temperature, top-k, top-p, min-p, penalties, masked ids, tie-heavy rows, -inf entries, NaN / +inf /
// all -inf / bad penalty ids). Exact agreement is expected: both sides compute the same float and
// fixed-point values (token_sampling.h); only a weight whose double exp straddles a float rounding
// boundary differently on the two math libraries could differ, and only at a decision boundary.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/sampling_kernels.h"
#include "k3/backend/cuda/sampling_rows.h"
#include "k3/sampling/token_sampling.h"

namespace {

using k3::cuda::DeviceBuffer;
using k3::sampling::RowSampling;
using k3::sampling::SampleResult;
using k3::sampling::SampleStatus;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Case {
  RowSampling r;
  std::vector<int32_t> rep, cnt_ids, cnts;  // storage behind r's spans
  std::vector<float> logits;
};

// Runs every case's row through the kernel (one launch) and through sample_row; returns mismatches.
int compare(std::vector<Case>& cases, int64_t V, bool verbose = true) {
  std::vector<RowSampling> rows;
  std::vector<float> all;
  for (Case& c : cases) {
    c.r.repetition_ids = c.rep;
    c.r.counted_ids = c.cnt_ids;
    c.r.counts = c.cnts;
    rows.push_back(c.r);
    all.insert(all.end(), c.logits.begin(), c.logits.end());
  }
  std::vector<k3::cuda::DeviceRowSampling> drows;
  std::vector<int32_t> ids;
  k3::cuda::flatten_rows(rows, drows, ids);
  ids.push_back(0);  // never empty
  const int R = static_cast<int>(rows.size());
  DeviceBuffer dl(all.size() * 4), dr(drows.size() * sizeof(drows[0])), di(ids.size() * 4), dout(R * sizeof(k3::cuda::DeviceSampleResult));
  K3_CUDA_CHECK(cudaMemcpy(dl.get(), all.data(), all.size() * 4, cudaMemcpyHostToDevice));
  K3_CUDA_CHECK(cudaMemcpy(dr.get(), drows.data(), drows.size() * sizeof(drows[0]), cudaMemcpyHostToDevice));
  K3_CUDA_CHECK(cudaMemcpy(di.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  K3_CUDA_CHECK(k3::cuda::sample_rows(dl.get<float>(), V, dr.get<k3::cuda::DeviceRowSampling>(), di.get<int32_t>(), R,
                                      dout.get<k3::cuda::DeviceSampleResult>(), nullptr));
  std::vector<k3::cuda::DeviceSampleResult> got(static_cast<size_t>(R));
  K3_CUDA_CHECK(cudaMemcpy(got.data(), dout.get(), got.size() * sizeof(got[0]), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < R; ++i) {
    std::vector<float> x = cases[static_cast<size_t>(i)].logits;
    const SampleResult want = k3::sampling::sample_row(x, rows[static_cast<size_t>(i)]);
    const SampleResult g = k3::cuda::to_result(got[static_cast<size_t>(i)]);
    if (g.token != want.token || g.status != want.status || g.at != want.at) {
      ++bad;
      if (verbose)
        ADD_FAILURE() << "V=" << V << " row " << i << ": gpu token " << g.token << " (" << k3::sampling::describe(g)
                      << "), host " << want.token << " (" << k3::sampling::describe(want) << "); T=" << rows[i].temperature
                      << " k=" << rows[i].top_k << " p=" << rows[i].top_p << " min_p=" << rows[i].min_p;
    }
  }
  return bad;
}

std::vector<float> random_logits(int64_t V, std::mt19937_64& rng, float scale, bool ties) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(static_cast<size_t>(V));
  for (auto& x : v) {
    x = nd(rng);
    if (ties) x = std::round(x * 4.0f) / 4.0f;  // a few dozen distinct values: ties everywhere
  }
  return v;
}

std::vector<Case> make_cases(int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::vector<Case> cs;
  auto add = [&](float T, int k, float p, float min_p, bool ties = false, float scale = 2.0f) -> Case& {
    Case c;
    c.logits = random_logits(V, rng, scale, ties);
    c.r.temperature = T;
    c.r.top_k = k;
    c.r.top_p = p;
    c.r.min_p = min_p;
    c.r.n_tokenizable = V;
    c.r.u = U(rng);
    cs.push_back(std::move(c));
    return cs.back();
  };
  const int k_big = static_cast<int>(std::min<int64_t>(V - 1, 1000));
  for (int rep = 0; rep < 3; ++rep) {
    add(0.0f, 0, 1.0f, 0.0f);
    add(1.0f, 0, 1.0f, 0.0f);
    add(0.7f, 50, 1.0f, 0.0f);
    add(1.0f, 0, 0.9f, 0.0f);
    add(1.3f, 0, 0.5f, 0.05f);
    add(1.0f, k_big, 0.95f, 0.0f);
    add(1.0f, static_cast<int>(V - 1), 1.0f, 0.0f);
    add(1.0f, 0, 1.0f, 0.2f);
    add(0.05f, 0, 1.0f, 0.0f);                 // near-greedy: few non-zero weights
    add(2.5f, 0, 0.99f, 0.0f, false, 0.5f);    // flat: a long top-p prefix
    add(1.0f, 40, 0.8f, 0.3f);
    add(1.0f, 7, 1.0f, 0.0f, true);            // ties at the k-th value
    add(1.0f, 0, 0.6f, 0.0f, true);            // ties at the top-p threshold
    add(0.9f, 20, 0.7f, 0.1f, true);
    add(1.0f, 1, 1.0f, 0.0f);                  // top-k 1 == greedy
    add(1.0f, 0, 1e-6f, 0.0f);                 // top-p tiny == greedy
  }
  {  // peaked rows (a language model's usual shape): top-k / top-p take the candidate path; k > 2048
     // and flat rows take the radix-select path
    auto peak = [&](Case& c) {
      for (int j = 0; j < 32; ++j) c.logits[static_cast<size_t>(rng() % static_cast<uint64_t>(V))] += 14.0f;
    };
    peak(add(1.0f, 0, 0.9f, 0.0f));
    peak(add(0.8f, 0, 0.95f, 0.0f, true));
    peak(add(1.0f, 20, 0.9f, 0.02f));
    peak(add(1.2f, 0, 0.5f, 0.0f));
    peak(add(1.0f, 50, 0.9f, 0.0f));  // k beyond the raised ids: the refined pivots
    if (V > 5000) add(1.0f, 5000, 1.0f, 0.0f);
  }
  {  // masked ids (a vocab padded past the tokenizer's) and -inf entries
    Case& c = add(1.0f, 0, 0.9f, 0.0f);
    c.r.n_tokenizable = V - V / 3;
    Case& d = add(0.8f, 30, 1.0f, 0.0f);
    for (int64_t i = 0; i < V; i += 3) d.logits[static_cast<size_t>(i)] = kNegInf;
    Case& e = add(0.0f, 0, 1.0f, 0.0f);
    e.r.n_tokenizable = V / 2;
  }
  {  // penalties
    for (int rep = 0; rep < 2; ++rep) {
      Case& c = add(rep ? 0.0f : 1.0f, rep ? 0 : 100, rep ? 1.0f : 0.9f, 0.0f);
      c.r.repetition_penalty = 1.3f;
      c.r.presence_penalty = 0.5f;
      c.r.frequency_penalty = 0.3f;
      std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(V - 1));
      std::vector<uint8_t> seen(static_cast<size_t>(V), 0);
      for (int j = 0; j < 300; ++j) {
        const int32_t t = id(rng);
        if (seen[static_cast<size_t>(t)]++) continue;
        c.rep.push_back(t);
        if (j % 2 == 0) {
          c.cnt_ids.push_back(t);
          c.cnts.push_back(1 + j % 5);
        }
      }
      c.rep.push_back(static_cast<int32_t>(std::max_element(c.logits.begin(), c.logits.end()) - c.logits.begin()));
    }
  }
  {  // errors
    Case& n = add(1.0f, 0, 1.0f, 0.0f);
    n.logits[static_cast<size_t>(V / 2)] = std::nanf("");
    n.logits[static_cast<size_t>(V / 3)] = std::nanf("");
    Case& p = add(1.0f, 0, 1.0f, 0.0f);
    p.logits[static_cast<size_t>(V - 2)] = std::numeric_limits<float>::infinity();
    Case& a = add(1.0f, 0, 1.0f, 0.0f);
    for (auto& x : a.logits) x = kNegInf;
    Case& m = add(0.0f, 0, 1.0f, 0.0f);
    m.r.n_tokenizable = 0;
    Case& b = add(1.0f, 0, 1.0f, 0.0f);
    b.r.repetition_penalty = 1.2f;
    b.rep = {3, static_cast<int32_t>(V), 5};
  }
  {  // the extremes of the draw
    add(1.0f, 0, 1.0f, 0.0f).r.u = 0.0;
    add(1.0f, 0, 0.9f, 0.0f).r.u = std::nextafter(1.0, 0.0);
  }
  return cs;
}

TEST(CudaSampling, MatchesHostReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int64_t V : {int64_t{1000}, int64_t{8192}, int64_t{50001}, int64_t{163840}}) {
    auto cases = make_cases(V, 1000 + static_cast<uint64_t>(V));
    EXPECT_EQ(compare(cases, V), 0) << "V=" << V;
  }
}

// Many rows with fresh draws: the token streams agree draw for draw (the property the engine's
// seeded requests rely on when the GPU samples).
TEST(CudaSampling, ManyDrawsAgree) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t V = 32768;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  std::vector<Case> cs;
  const auto base = random_logits(V, rng, 3.0f, false);
  for (int i = 0; i < 512; ++i) {
    Case c;
    c.logits = base;
    c.r.temperature = 0.6f + 0.1f * static_cast<float>(i % 8);
    c.r.top_k = (i % 3 == 0) ? 64 : 0;
    c.r.top_p = (i % 2 == 0) ? 0.9f : 1.0f;
    c.r.u = U(rng);
    cs.push_back(std::move(c));
  }
  EXPECT_EQ(compare(cs, V), 0);
}

// Prints only (scripts/gpu-bench runs it): time per launch at the K3 vocab, on two row shapes:
// "peaked" (Gaussian sd 2 plus 32 ids raised by 14: a language model's usual row, top-p sets of tens
// of ids) and "flat" (Gaussian sd 3: top-p 0.9 keeps ~10k ids, the candidate path's worst case).
TEST(CudaSamplingTiming, Rows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t V = 163840;
  for (int flat = 0; flat < 2; ++flat)
  for (int R : {1, 64, 256}) {
    for (int mode = 0; mode < 4; ++mode) {
      if (flat && mode == 0) continue;
      std::mt19937_64 rng(3);
      std::vector<RowSampling> rows(static_cast<size_t>(R));
      std::vector<float> all;
      for (auto& r : rows) {
        r.temperature = mode == 0 ? 0.0f : 1.0f;
        r.top_p = mode >= 2 ? 0.9f : 1.0f;
        r.top_k = mode == 3 ? 50 : 0;
        r.u = 0.5;
        auto l = random_logits(V, rng, flat ? 3.0f : 2.0f, false);
        if (!flat)
          for (int j = 0; j < 32; ++j) l[static_cast<size_t>(rng() % V)] += 14.0f;
        all.insert(all.end(), l.begin(), l.end());
      }
      std::vector<k3::cuda::DeviceRowSampling> drows;
      std::vector<int32_t> ids{0};
      k3::cuda::flatten_rows(rows, drows, ids);
      ids.push_back(0);
      DeviceBuffer src(all.size() * 4), dl(all.size() * 4), dr(drows.size() * sizeof(drows[0])), di(4 * ids.size()),
          dout(static_cast<size_t>(R) * 16);
      K3_CUDA_CHECK(cudaMemcpy(src.get(), all.data(), all.size() * 4, cudaMemcpyHostToDevice));
      K3_CUDA_CHECK(cudaMemcpy(dr.get(), drows.data(), drows.size() * sizeof(drows[0]), cudaMemcpyHostToDevice));
      K3_CUDA_CHECK(cudaMemcpy(di.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      float total = 0;
      const int reps = 20;
      for (int it = 0; it < reps + 2; ++it) {
        K3_CUDA_CHECK(cudaMemcpy(dl.get(), src.get(), all.size() * 4, cudaMemcpyDeviceToDevice));
        cudaEventRecord(a);
        K3_CUDA_CHECK(k3::cuda::sample_rows(dl.get<float>(), V, dr.get<k3::cuda::DeviceRowSampling>(), di.get<int32_t>(), R,
                                            dout.get<k3::cuda::DeviceSampleResult>(), nullptr));
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (it >= 2) total += ms;
      }
      static const char* names[] = {"greedy", "T=1", "T=1 top_p=0.9", "T=1 top_k=50 top_p=0.9"};
      std::printf("sampling V=%lld %-6s rows=%3d %-24s %8.1f us/launch\n", static_cast<long long>(V), flat ? "flat" : "peaked", R, names[mode],
                  1000.0 * total / reps);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace
