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

// The kernel's result as the host type.
inline sampling::SampleResult to_result(const DeviceSampleResult& r) {
  return {r.token, static_cast<sampling::SampleStatus>(r.status), r.at};
}

}  // namespace k3::cuda
