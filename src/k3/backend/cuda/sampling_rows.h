// Host side of GPU sampling: sampling::RowSampling (the engine's per-row description) flattened into the
// kernel's plain structs, with every row's penalty lists packed into one int32 array.
#pragma once
#include <span>
#include <vector>

#include "k3/backend/cuda/sampling_kernels.h"
#include "k3/sampling/token_sampling.h"

namespace k3::cuda {

void flatten_rows(std::span<const sampling::RowSampling> rows, std::vector<DeviceRowSampling>& out,
                  std::vector<int32_t>& ids);

// Every row's logit_bias and grammar mask for constrain_rows; false (outputs empty) when no row has
// either, so the caller skips the launch. Throws k3::Error for a bias id outside [0, V).
struct FlatConstraints {
  std::vector<DeviceRowConstraint> rows;
  std::vector<int32_t> bias_ids;
  std::vector<float> bias_values;
  std::vector<uint32_t> mask;
};
bool flatten_constraints(std::span<const sampling::RowSampling> rows, int64_t V, FlatConstraints& out);

// The kernel's result as the host type.
inline sampling::SampleResult to_result(const DeviceSampleResult& r) {
  return {r.token, static_cast<sampling::SampleStatus>(r.status), r.at};
}

}  // namespace k3::cuda
