// Where each weight lives, in the flags users know from llama.cpp: `--override-tensor / -ot PATTERN=DEVICE`
// (PCRE2 pattern searched in the checkpoint tensor name, e.g. "model.layers.3.block_sparse_moe.experts.7.w1
// .weight"; DEVICE = CPU or CUDA0 / cuda:0), `--cpu-moe` (every routed expert on the CPU) and `--n-cpu-moe N`
// (the routed experts of the first N layers). Rules are tried in order, the first match wins; a tensor no
// rule matches lives on the model's device. Matrices (projections, embeddings, head, experts) are placed;
// small vectors (norms, biases, conv taps) always follow the model's device.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace k3 {

class Placement {
 public:
  Placement();
  ~Placement();
  Placement(Placement&&) noexcept;
  Placement& operator=(Placement&&) noexcept;

  // Throws k3::Error naming the flag and the bad value (pattern that does not compile, unknown device).
  static Placement parse(const std::vector<std::string>& override_tensor, bool cpu_moe, int n_cpu_moe);
  // The home of tensor `name` (not thread-safe: one binder asks): kHostDevice (core/weight.h), a CUDA ordinal, or `model_device` when no
  // rule matches.
  int device_of(const std::string& name, int model_device) const;
  bool empty() const;
  // Every rule places on the host.
  bool only_host() const;
  // "pattern=DEVICE" per rule, for start-up logs.
  std::vector<std::string> describe() const;

 private:
  struct Rule;
  std::vector<std::unique_ptr<Rule>> rules_;
};

}  // namespace k3
