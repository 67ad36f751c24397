#include "k3/backend/cuda/sampling_rows.h"

#include <algorithm>

#include "k3/core/error.h"

namespace k3::cuda {

void flatten_rows(std::span<const sampling::RowSampling> rows, std::vector<DeviceRowSampling>& out,
                  std::vector<int32_t>& ids) {
  out.clear();
  ids.clear();
  for (const sampling::RowSampling& r : rows) {
    if (r.counts.size() != r.counted_ids.size()) throw Error("sampling: counted_ids and counts differ in length");
    DeviceRowSampling d{};
    d.u = r.u;
    d.n_tokenizable = r.n_tokenizable;
    d.temperature = r.temperature;
    d.top_p = r.top_p;
    d.min_p = r.min_p;
    d.repetition_penalty = r.repetition_penalty;
    d.presence_penalty = r.presence_penalty;
    d.frequency_penalty = r.frequency_penalty;
    d.top_k = r.top_k;
    d.rep_off = static_cast<int32_t>(ids.size());
    d.rep_n = r.repetition_penalty != 1.0f ? static_cast<int32_t>(r.repetition_ids.size()) : 0;
    if (d.rep_n) ids.insert(ids.end(), r.repetition_ids.begin(), r.repetition_ids.end());
    d.cnt_off = static_cast<int32_t>(ids.size());
    d.cnt_n = r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f ? static_cast<int32_t>(r.counted_ids.size()) : 0;
    if (d.cnt_n) {
      ids.insert(ids.end(), r.counted_ids.begin(), r.counted_ids.end());
      ids.insert(ids.end(), r.counts.begin(), r.counts.end());
    }
    out.push_back(d);
  }
}

bool flatten_constraints(std::span<const sampling::RowSampling> rows, int64_t V, FlatConstraints& out) {
  out.rows.clear();
  out.bias_ids.clear();
  out.bias_values.clear();
  out.mask.clear();
  bool any = false;
  for (const sampling::RowSampling& r : rows) any = any || r.constrained();
  if (!any) return false;
  for (const sampling::RowSampling& r : rows) {
    if (r.bias_ids.size() != r.bias_values.size()) throw Error("sampling: bias_ids and bias_values differ in length");
    DeviceRowConstraint d{};
    d.bias_off = static_cast<int32_t>(out.bias_ids.size());
    d.bias_n = static_cast<int32_t>(r.bias_ids.size());
    for (int32_t t : r.bias_ids)
      if (t < 0 || t >= V) throw Error("sampling: logit_bias token id " + std::to_string(t) + " is outside the vocab");
    out.bias_ids.insert(out.bias_ids.end(), r.bias_ids.begin(), r.bias_ids.end());
    out.bias_values.insert(out.bias_values.end(), r.bias_values.begin(), r.bias_values.end());
    d.mask_off = static_cast<int32_t>(out.mask.size());
    d.mask_words = static_cast<int32_t>(r.allowed.size());
    out.mask.insert(out.mask.end(), r.allowed.begin(), r.allowed.end());
    out.rows.push_back(d);
  }
  return true;
}

}  // namespace k3::cuda
