// cuda::upload_weights on GGUF's block formats: a dense projection or the embedding table goes up as its
// blocks, byte for byte (quant_kernels.h reads them); routed experts in these formats have no CUDA kernels
// yet (docs/quantization.md): a clear k3::Error naming the format, never the blocks misread as another
// format; a matrix placed on the host stays a host view (the CUDA backend runs it through the CPU kernels).
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

TEST(CudaQuantUpload, GgufBlockMatricesGoUpAsTheirBytesExpertsAreRejectedClearly) {
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
    // Routed experts: refused, naming the format and where.
    k3::ModelWeights we = base;
    bool has_experts = false;
    for (k3::LayerWeights& L : we.layers)
      if (L.is_moe && !L.moe.experts.empty()) {
        for (k3::GluMlp& e : L.moe.experts)
          e.gate = quantised(e.gate, f, 0), e.up = quantised(e.up, f, 0), e.down = quantised(e.down, f, 0);
        has_experts = true;
        break;
      }
    ASSERT_TRUE(has_experts);
    k3::cuda::DeviceWeights de;
    try {
      k3::cuda::upload_weights(we, 0, de);
      ADD_FAILURE() << k3::weight_format_name(f) << " routed experts were uploaded";
    } catch (const k3::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string(k3::weight_format_name(f)) + " is not supported on CUDA yet"), std::string::npos) << msg;
      EXPECT_NE(msg.find("routed experts"), std::string::npos) << msg;
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
