// -ot / --override-tensor rules (model/placement.h): any lines either parse into rules, which then answer
// for a set of real tensor names without crashing, or throw k3::Error. The first byte picks --cpu-moe and
// --n-cpu-moe; every following line is one PATTERN=DEVICE flag value.
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/model/placement.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool cpu_moe = data[0] & 1;
  const int n_cpu_moe = (data[0] >> 1) % 8 == 7 ? 1000000 : (data[0] >> 1) % 8;
  std::vector<std::string> rules;
  std::string cur;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == '\n') {
      rules.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  if (!cur.empty()) rules.push_back(cur);
  try {
    const k3::Placement p = k3::Placement::parse(rules, cpu_moe, n_cpu_moe);
    for (const char* name : {"language_model.model.layers.3.block_sparse_moe.experts.12.w1.weight",
                             "model.layers.0.mlp.gate_proj.weight", "model.embed_tokens.weight", "lm_head.weight",
                             "model.layers.99999999999.block_sparse_moe.experts.0.w2.weight", ""})
      (void)p.device_of(name, 0);
    (void)p.describe();
  } catch (const k3::Error&) {
  }
  return 0;
}
