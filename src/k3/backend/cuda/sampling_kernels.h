// Token sampling on the GPU: the device twin of sampling/token_sampling.h (the host reference, whose
// header specifies the algorithm and the exact arithmetic both sides share). One thread block per row
// works on the row's logits in place, so only the chosen ids (16 bytes a row) cross to the host.
// Header kept C++17 (nvcc compiles the .cu files as C++17): plain structs, no std::span.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// One row's parameters (RowSampling, flattened). Penalty lists live in one int32 array shared by all
// rows: ids[rep_off .. rep_off + rep_n), ids[cnt_off .. cnt_off + cnt_n) with their counts at
// ids[cnt_off + cnt_n .. cnt_off + 2 cnt_n).
struct DeviceRowSampling {
  double u;
  int64_t n_tokenizable;
  float temperature, top_p, min_p;
  float repetition_penalty, presence_penalty, frequency_penalty;
  int32_t top_k;
  int32_t rep_off, rep_n, cnt_off, cnt_n;
  int32_t pad;
};

// token, status (sampling::SampleStatus values), offending id.
struct DeviceSampleResult {
  int32_t token, status, at, pad;
};

// Samples rows [0, R) of logits [R][V] (overwritten: penalised, masked, then weights). `ids` holds the
// penalty lists (may be null when no row has penalties).
cudaError_t sample_rows(float* logits, int64_t V, const DeviceRowSampling* rows, const int32_t* ids, int R,
                        DeviceSampleResult* out, cudaStream_t stream);

}  // namespace k3::cuda
