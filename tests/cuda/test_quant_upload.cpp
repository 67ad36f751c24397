// cuda::upload_weights on GGUF's block formats: a dense projection, the embedding table and routed-expert
// stacks go up as their blocks, byte for byte (quant_kernels.h / quant_moe.h read them, no widening); a
// matrix placed on the host stays a host view (the CUDA backend runs it through the CPU kernels).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cuda/device_weights.h"
#include "k3/core/error.h"
#include "k3/model/model.h"
#include "test_util.h"

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(CudaQuantUpload, GgufBlockMatricesGoUpAsTheirBytes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto cpu = k3::Model::load(k3test::source_path("tests/data/tiny-k3"));
  const k3::ModelWeights& base = cpu->weights();
  std::vector<uint8_t> blocks(4 << 20);
  std::mt19937 rng(3);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  auto quantised = [&](k3::WeightMatrix m, k3::WeightFormat f, int device) {
    m.format = f;
    m.data = blocks.data();
    m.scales = nullptr;
    m.device = device;
    m.cols = 256;  // whole blocks of every format (tiny-k3's hidden size is 128)
    return m;
  };
  for (k3::WeightFormat f : {k3::WeightFormat::Q4_K, k3::WeightFormat::Q8_0, k3::WeightFormat::IQ2_XXS}) {
    // The head and the token table: uploaded, the device bytes equal to the host's.
    k3::ModelWeights w = base;
    ASSERT_LE(w.lm_head.rows * k3::row_data_bytes(f, w.lm_head.cols), static_cast<int64_t>(blocks.size()));
    ASSERT_LE(w.embed.rows * k3::row_data_bytes(f, w.embed.cols), static_cast<int64_t>(blocks.size()));
    w.lm_head = quantised(w.lm_head, f, 0);
    w.embed = quantised(w.embed, f, 0);
    k3::cuda::DeviceWeights dw;
    ASSERT_NO_THROW(k3::cuda::upload_weights(w, 0, dw)) << k3::weight_format_name(f);
    for (const k3::WeightMatrix* m : {&dw.w.lm_head, &dw.w.embed}) {
      EXPECT_EQ(m->format, f);
      EXPECT_EQ(m->device, 0);
      EXPECT_NE(m->data, static_cast<const void*>(blocks.data()));
      std::vector<uint8_t> back(static_cast<size_t>(m->rows * k3::row_data_bytes(f, m->cols)));
      ASSERT_EQ(cudaMemcpy(back.data(), m->data, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(0, std::memcmp(back.data(), blocks.data(), back.size())) << k3::weight_format_name(f);
    }
    // Routed experts: stacked as their blocks, no scale array (quant_moe.h).
    k3::ModelWeights we = base;
    int64_t rows = 0, n_experts = 0;
    for (k3::LayerWeights& L : we.layers)
      if (L.is_moe && !L.moe.experts.empty()) {
        // 256 x 256 each (hidden X and expert width I both whole blocks: down's columns are I = gate's rows).
        auto square = [&](const k3::WeightMatrix& m) {
          k3::WeightMatrix q = quantised(m, f, 0);
          q.rows = 256;
          return q;
        };
        for (k3::GluMlp& e : L.moe.experts) e.gate = square(e.gate), e.up = square(e.up), e.down = square(e.down);
        rows = L.moe.experts[0].gate.rows;
        n_experts = static_cast<int64_t>(L.moe.experts.size());
        break;
      }
    ASSERT_GT(n_experts, 0);
    k3::cuda::DeviceWeights de;
    ASSERT_NO_THROW(k3::cuda::upload_weights(we, 0, de)) << k3::weight_format_name(f) << " routed experts";
    bool seen = false;
    for (const k3::LayerWeights& L : de.w.layers)
      if (!L.moe.stacked.empty() && !seen) {
        seen = true;
        const k3::ExpertStack& st = L.moe.stacked;
        EXPECT_EQ(st.format, f);
        EXPECT_EQ(st.E, n_experts);
        EXPECT_EQ(st.gate_scales, nullptr);
        const size_t one = static_cast<size_t>(rows * k3::row_data_bytes(f, 256));
        std::vector<uint8_t> back(one * static_cast<size_t>(n_experts));
        ASSERT_EQ(cudaMemcpy(back.data(), st.up, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t e = 0; e < n_experts; ++e)  // every expert's up rows are the same host bytes
          EXPECT_EQ(0, std::memcmp(back.data() + e * one, blocks.data(), one)) << k3::weight_format_name(f) << " expert " << e;
      }
    EXPECT_TRUE(seen);
    // gate / up quantised, down as shipped (an expert width that is not whole blocks stays MXFP4): one stack
    // has one format, so a clear error naming it (such a layer runs with --cpu-moe).
    k3::ModelWeights wm = base;
    for (k3::LayerWeights& L : wm.layers)
      if (L.is_moe && !L.moe.experts.empty()) {
        for (k3::GluMlp& e : L.moe.experts) {
          e.gate = quantised(e.gate, f, 0), e.up = quantised(e.up, f, 0);
          e.gate.rows = e.up.rows = 256;  // whole blocks, as above: the format check is what must fail
          e.down.device = 0;              // placed on the GPU too (an expert on the host keeps the layer there)
        }
        break;
      }
    k3::cuda::DeviceWeights dm;
    try {
      k3::cuda::upload_weights(wm, 0, dm);
      ADD_FAILURE() << "a layer of " << k3::weight_format_name(f) << " gate/up and other down experts was uploaded";
    } catch (const k3::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("a layer mixes ") + k3::weight_format_name(f)), std::string::npos) << e.what();
    }
  }
  // Placed on the host: a view of the host bytes, no error.
  k3::ModelWeights w = base;
  w.lm_head = quantised(w.lm_head, k3::WeightFormat::Q4_K, k3::kHostDevice);
  k3::cuda::DeviceWeights dw;
  EXPECT_NO_THROW(k3::cuda::upload_weights(w, 0, dw));
  EXPECT_EQ(dw.w.lm_head.data, blocks.data());
  EXPECT_EQ(dw.w.lm_head.format, k3::WeightFormat::Q4_K);
}

}  // namespace
