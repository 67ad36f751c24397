// The GPU's logit_bias + grammar mask step (constrain_rows, run before sample_rows) against the host
// reference sampling::sample_row, which applies both itself: the same token and status for every row, with
// random masks (dense, sparse, a single allowed id, none), bias pairs up to +-100, greedy and sampled rows,
// and a row whose mask allows nothing (AllMasked). Also: no forbidden id is ever picked.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/sampling_kernels.h"
#include "k3/backend/cuda/sampling_rows.h"
#include "k3/sampling/token_sampling.h"

namespace {

using k3::cuda::DeviceBuffer;
using k3::sampling::RowSampling;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(CudaConstrain, MaskAndBiasMatchTheHostReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t V : {1000, 8192, 163840}) {
    std::mt19937_64 rng(static_cast<uint64_t>(V));
    std::normal_distribution<float> nd(0.0f, 3.0f);
    const int R = 24;
    const size_t W = static_cast<size_t>((V + 31) / 32);
    std::vector<std::vector<uint32_t>> masks(R);
    std::vector<std::vector<int32_t>> bias_ids(R);
    std::vector<std::vector<float>> bias_vals(R);
    std::vector<RowSampling> rows(R);
    std::vector<float> logits(static_cast<size_t>(R * V));
    for (auto& x : logits) x = nd(rng);
    for (int r = 0; r < R; ++r) {
      RowSampling& row = rows[r];
      row.temperature = r % 3 == 0 ? 0.0f : 2.0f;
      row.u = std::uniform_real_distribution<double>(0, 1)(rng);
      const int kind = r % 6;  // 0 none, 1 dense, 2 sparse, 3 single id, 4 nothing allowed, 5 bias only
      if (kind >= 1 && kind <= 4) {
        masks[r].assign(W, 0);
        for (int64_t i = 0; i < V; ++i) {
          const bool on = kind == 1 ? rng() % 4 != 0 : kind == 2 ? rng() % 500 == 0 : false;
          if (on) masks[r][static_cast<size_t>(i / 32)] |= 1u << (i % 32);
        }
        if (kind == 3) masks[r][static_cast<size_t>((V / 3) / 32)] |= 1u << ((V / 3) % 32);
        if (kind == 2) masks[r][0] |= 1u;  // at least one allowed
        row.allowed = masks[r];
      }
      if (kind != 4 && r % 2 == 0) {
        for (int j = 0; j < 8; ++j) {
          bias_ids[r].push_back(static_cast<int32_t>((j * 7919 + r * 131) % V));
          bias_vals[r].push_back(j % 2 ? 100.0f : -37.5f);
        }
        std::sort(bias_ids[r].begin(), bias_ids[r].end());
        bias_ids[r].erase(std::unique(bias_ids[r].begin(), bias_ids[r].end()), bias_ids[r].end());
        bias_vals[r].resize(bias_ids[r].size());
        row.bias_ids = bias_ids[r];
        row.bias_values = bias_vals[r];
      }
    }
    std::vector<k3::cuda::DeviceRowSampling> drows;
    std::vector<int32_t> ids;
    k3::cuda::flatten_rows(rows, drows, ids);
    ids.push_back(0);
    k3::cuda::FlatConstraints fc;
    ASSERT_TRUE(k3::cuda::flatten_constraints(rows, V, fc));
    fc.bias_ids.push_back(0);
    fc.bias_values.push_back(0);
    fc.mask.push_back(0);
    DeviceBuffer dl(logits.size() * 4), dr(drows.size() * sizeof(drows[0])), di(ids.size() * 4),
        dc(fc.rows.size() * sizeof(fc.rows[0])), dbi(fc.bias_ids.size() * 4), dbv(fc.bias_values.size() * 4),
        dm(fc.mask.size() * 4), dout(R * sizeof(k3::cuda::DeviceSampleResult));
    K3_CUDA_CHECK(cudaMemcpy(dl.get(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaMemcpy(dr.get(), drows.data(), drows.size() * sizeof(drows[0]), cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaMemcpy(di.get(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaMemcpy(dc.get(), fc.rows.data(), fc.rows.size() * sizeof(fc.rows[0]), cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaMemcpy(dbi.get(), fc.bias_ids.data(), fc.bias_ids.size() * 4, cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaMemcpy(dbv.get(), fc.bias_values.data(), fc.bias_values.size() * 4, cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaMemcpy(dm.get(), fc.mask.data(), fc.mask.size() * 4, cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(k3::cuda::constrain_rows(dl.get<float>(), V, dc.get<k3::cuda::DeviceRowConstraint>(), dbi.get<int32_t>(),
                                           dbv.get<float>(), dm.get<uint32_t>(), R, nullptr));
    K3_CUDA_CHECK(k3::cuda::sample_rows(dl.get<float>(), V, dr.get<k3::cuda::DeviceRowSampling>(), di.get<int32_t>(), R,
                                        dout.get<k3::cuda::DeviceSampleResult>(), nullptr));
    std::vector<k3::cuda::DeviceSampleResult> got(R);
    K3_CUDA_CHECK(cudaMemcpy(got.data(), dout.get(), got.size() * sizeof(got[0]), cudaMemcpyDeviceToHost));
    for (int r = 0; r < R; ++r) {
      std::vector<float> x(logits.begin() + r * V, logits.begin() + (r + 1) * V);
      const auto want = k3::sampling::sample_row(x, rows[r]);
      const auto g = k3::cuda::to_result(got[r]);
      EXPECT_EQ(g.token, want.token) << "V=" << V << " row " << r;
      EXPECT_EQ(g.status, want.status) << "V=" << V << " row " << r;
      if (!masks[r].empty() && g.token >= 0) {
        EXPECT_TRUE((masks[r][static_cast<size_t>(g.token / 32)] >> (g.token % 32)) & 1u) << "forbidden id " << g.token;
      }
    }
  }
}

}  // namespace
