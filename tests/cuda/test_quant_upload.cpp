// cuda::upload_weights on GGUF's block formats, which have CPU kernels only so far (docs/quantization.md):
// a clear k3::Error naming the format and where it was met (a dense projection, the embedding table, routed
// experts), never the blocks misread as another format; a matrix placed on the host stays a host view (the
// CUDA backend runs it through the CPU kernels).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
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

TEST(CudaQuantUpload, GgufBlockFormatsAreRejectedClearly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto cpu = k3::Model::load(k3test::source_path("tests/data/tiny-k3"));
  const k3::ModelWeights& base = cpu->weights();
  // Never read: the upload rejects the format before it touches the bytes.
  std::vector<uint8_t> blocks(1 << 20);
  auto quantised = [&](k3::WeightMatrix m, k3::WeightFormat f, int device) {
    m.format = f;
    m.data = blocks.data();
    m.scales = nullptr;
    m.device = device;
    return m;
  };
  struct Case {
    const char* where;  // as the error names it
    std::function<bool(k3::ModelWeights&, k3::WeightFormat)> set;  // false: the checkpoint has no such matrix
  };
  const Case cases[] = {
      {"a dense projection", [&](k3::ModelWeights& w, k3::WeightFormat f) { w.lm_head = quantised(w.lm_head, f, 0); return true; }},
      {"an embedding table", [&](k3::ModelWeights& w, k3::WeightFormat f) { w.embed = quantised(w.embed, f, 0); return true; }},
      {"routed experts", [&](k3::ModelWeights& w, k3::WeightFormat f) {
         for (k3::LayerWeights& L : w.layers)
           if (L.is_moe && !L.moe.experts.empty()) {
             for (k3::GluMlp& e : L.moe.experts)
               e.gate = quantised(e.gate, f, 0), e.up = quantised(e.up, f, 0), e.down = quantised(e.down, f, 0);
             return true;
           }
         return false;
       }},
  };
  for (k3::WeightFormat f : {k3::WeightFormat::Q4_K, k3::WeightFormat::Q8_0, k3::WeightFormat::IQ2_XXS}) {
    for (const Case& c : cases) {
      k3::ModelWeights w = base;
      if (!c.set(w, f)) continue;
      k3::cuda::DeviceWeights dw;
      try {
        k3::cuda::upload_weights(w, 0, dw);
        ADD_FAILURE() << k3::weight_format_name(f) << " in " << c.where << " was uploaded";
      } catch (const k3::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(std::string(k3::weight_format_name(f)) + " is not supported on CUDA yet"), std::string::npos) << msg;
        EXPECT_NE(msg.find(c.where), std::string::npos) << msg;
      }
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
