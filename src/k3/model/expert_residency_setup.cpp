#include "k3/model/expert_residency_setup.h"

#include <vector>

namespace k3 {

namespace {

// Whether the CPU reads m's stored bytes: not a routed expert with the CPU's copy (`tiled`, made by
// add_expert_decode_layouts, backend/cpu/decode_layout.h), which every product of it reads instead and whose stored
// pages were released.
bool reads_stored(const WeightMatrix& m) { return m.tiled == nullptr; }

// The stored byte ranges expert `e` reads: its three matrices' data and scales, the copied ones left out.
std::vector<ByteSpan> expert_spans(const GluMlp& e) {
  std::vector<ByteSpan> s;
  for (const WeightMatrix* m : {&e.gate, &e.up, &e.down}) {
    if (!reads_stored(*m)) continue;
    const int64_t data = m->rows * row_data_bytes(m->format, m->cols);
    const int64_t scales = m->rows * row_scale_bytes(m->format, m->cols);
    s.push_back({static_cast<const uint8_t*>(m->data), static_cast<size_t>(data)});
    if (m->scales) s.push_back({m->scales, static_cast<size_t>(scales)});
  }
  return s;
}

bool on_host(const GluMlp& e) {
  return e.gate.device == kHostDevice && e.up.device == kHostDevice && e.down.device == kHostDevice;
}

}  // namespace

std::unique_ptr<ExpertResidency> make_expert_residency(const ModelWeights& w, const Checkpoint& ck,
                                                       ExpertResidencyOptions opt) {
  if (!opt.enabled) return nullptr;
  int64_t expert_bytes = 0, device_bytes = 0;  // host-resident experts; matrices a GPU holds (not needed in RAM)
  for (const LayerWeights& L : w.layers)
    for (const GluMlp& e : L.moe.experts)
      if (on_host(e))
        for (const WeightMatrix* m : {&e.gate, &e.up, &e.down}) expert_bytes += reads_stored(*m) ? m->bytes() : 0;
  if (expert_bytes == 0) return nullptr;
  for_each_matrix(w, [&](const WeightMatrix& m) {
    if (m.device != kHostDevice) device_bytes += m.bytes();
  });
  if (opt.hot_budget_bytes == ExpertResidencyOptions::kAutoBudget) {
    const int64_t other = w.bound_bytes - device_bytes - expert_bytes;  // the rest the CPU reads every step
    const int64_t auto_budget = ExpertResidency::auto_budget(other);
    const bool fits = static_cast<int64_t>(ck.total_bytes()) - device_bytes <= auto_budget + other;
    opt.hot_budget_bytes = fits ? 0 : auto_budget;
    if (fits && opt.trust_resident_steps == 0) opt.trust_resident_steps = 32;  // re-checked every 33 steps
  }
  std::vector<ByteSpan> regions;
  for (const MappedFile* f : ck.mappings()) regions.push_back({f->data(), f->size()});
  auto r = std::make_unique<ExpertResidency>(opt, std::move(regions));
  for (const LayerWeights& L : w.layers) {
    if (L.moe.experts.empty() || !on_host(L.moe.experts[0])) continue;
    std::vector<std::vector<ByteSpan>> experts;
    bool any = false;
    for (const GluMlp& e : L.moe.experts) {
      experts.push_back(expert_spans(e));
      any = any || !experts.back().empty();
    }
    if (any) r->add_layer(L.moe.experts[0].gate.data, experts);  // a layer read wholly from copies: not managed
  }
  return r;
}

}  // namespace k3
