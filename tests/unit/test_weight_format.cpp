// core/weight_format.h: the layout table that loaders, planners and backends size weights by.
#include <gtest/gtest.h>

#include "k3/core/weight.h"

namespace {

using k3::WeightFormat;

TEST(WeightFormat, LayoutsOfTodaysFormats) {
  EXPECT_EQ(k3::row_data_bytes(WeightFormat::F32, 7), 28);
  EXPECT_EQ(k3::row_data_bytes(WeightFormat::BF16, 7), 14);
  EXPECT_EQ(k3::row_data_bytes(WeightFormat::F16, 7), 14);
  EXPECT_EQ(k3::row_scale_bytes(WeightFormat::BF16, 7), 0);
  // MXFP4: 32 E2M1 nibbles in 16 bytes + one E8M0 scale byte (model-spec section 4)
  EXPECT_EQ(k3::row_data_bytes(WeightFormat::MXFP4, 96), 48);
  EXPECT_EQ(k3::row_scale_bytes(WeightFormat::MXFP4, 96), 3);
  EXPECT_DOUBLE_EQ(k3::bits_per_weight(WeightFormat::MXFP4), 4.25);
  EXPECT_DOUBLE_EQ(k3::bits_per_weight(WeightFormat::BF16), 16.0);
  EXPECT_TRUE(k3::is_block_format(WeightFormat::MXFP4));
  EXPECT_FALSE(k3::is_block_format(WeightFormat::F32));
  EXPECT_STREQ(k3::weight_format_name(WeightFormat::MXFP4), "MXFP4");
}

TEST(WeightFormat, MatrixRowsAndBytes) {
  std::vector<uint8_t> packed(5 * 32), scales(5 * 2);
  k3::WeightMatrix w;
  w.format = WeightFormat::MXFP4;
  w.data = packed.data();
  w.scales = scales.data();
  w.rows = 5;
  w.cols = 64;
  EXPECT_EQ(w.row_data(3), packed.data() + 3 * 32);
  EXPECT_EQ(w.row_scales(3), scales.data() + 3 * 2);
  EXPECT_EQ(w.bytes(), 5 * 64 / 2 + 5 * 64 / 32);
  w.format = WeightFormat::BF16;
  EXPECT_EQ(w.bytes(), 5 * 64 * 2);
}

TEST(WeightFormat, FloatDtypes) {
  WeightFormat f{};
  ASSERT_TRUE(k3::float_weight_format(k3::DType::BF16, &f));
  EXPECT_EQ(f, WeightFormat::BF16);
  ASSERT_TRUE(k3::float_weight_format(k3::DType::F16, &f));
  EXPECT_EQ(f, WeightFormat::F16);
  ASSERT_TRUE(k3::float_weight_format(k3::DType::F32, &f));
  EXPECT_EQ(f, WeightFormat::F32);
  EXPECT_FALSE(k3::float_weight_format(k3::DType::U8, &f));
}

}  // namespace
