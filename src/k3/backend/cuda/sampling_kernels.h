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

// A row's logit_bias and grammar mask (RowSampling::bias_ids / bias_values / allowed), flattened: its bias
// pairs at [bias_off, bias_off + bias_n) of the bias arrays, its mask words at [mask_off, mask_off +
// mask_words) of the word array (mask_words 0: no mask; ids past the words are not allowed).
struct DeviceRowConstraint {
  int32_t bias_off, bias_n, mask_off, mask_words;
};

// Step 0 of sampling (sampling::apply_bias_and_mask) on rows [0, R) of logits [R][V], in place, before
// sample_rows. Bias ids are distinct and in [0, V) (flatten_constraints checks them on the host).
cudaError_t constrain_rows(float* logits, int64_t V, const DeviceRowConstraint* rows, const int32_t* bias_ids,
                           const float* bias_values, const uint32_t* mask, int R, cudaStream_t stream);

// Samples rows [0, R) of logits [R][V] (overwritten: penalised, masked, then weights). `ids` holds the
// penalty lists (may be null when no row has penalties).
cudaError_t sample_rows(float* logits, int64_t V, const DeviceRowSampling* rows, const int32_t* ids, int R,
                        DeviceSampleResult* out, cudaStream_t stream);

}  // namespace k3::cuda
