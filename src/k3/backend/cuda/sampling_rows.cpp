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

}  // namespace k3::cuda
