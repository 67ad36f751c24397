// Importance matrices as llama.cpp's `llama-imatrix` makes them and `llama-quantize --imatrix` reads them
// (its GGUF format, learned from tools/imatrix/imatrix.cpp): for every weight matrix W of the transformer
// blocks ("blk.*" GGUF names), the per-column sum of the squared inputs W was multiplied with over the
// calibration text, per expert for routed experts, and the number of input rows:
//   general.type = "imatrix", imatrix.datasets (strings), imatrix.chunk_count, imatrix.chunk_size (u32);
//   tensors "<name>.in_sum2" F32 ne [cols, n_mat] and "<name>.counts" F32 ne [1, n_mat] (n_mat = experts, or 1),
//   sorted by name.
// So either tool can use either file. The quantisers weight each column's squared error by in_sum2 / count.
// kv_b, which llama.cpp's graph multiplies as two per-head stacks (attn_k_b ne [nope, rank, heads] with each head's
// q_nope, attn_v_b ne [rank, v, heads] with each head's attention output in latent space), gets those two entries
// (n_mat = heads, one count per head) from the absorbed MLA form, so calibration runs the decode forms
// (calibration_forward_options); without them llama-quantize refuses its very-low-bit types for those tensors.
// Not collected: matrices outside the blocks (token_embd, output), which llama-imatrix also skips by default.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/weights.h"

namespace k3 {

struct ImatrixEntry {
  int64_t cols = 0;
  std::vector<double> in_sum2;  // [n_mat][cols]
  std::vector<double> counts;   // [n_mat]
};

struct Imatrix {
  std::map<std::string, ImatrixEntry> entries;  // by GGUF weight name ("blk.3.attn_q_a.weight")
  std::vector<std::string> datasets;
  int64_t chunk_count = 0, chunk_size = 0;

  // Column weights of matrix `name` (expert `mat` of a stacked one): in_sum2 / count, or empty when the
  // file has no entry or the matrix saw no input (the quantiser then weights all columns alike).
  std::vector<float> importance(const std::string& name, int64_t mat, int64_t cols) const;
};

// Collects an Imatrix from the CPU backend's activations of a model loaded from `ckpt` (an HF dir, or a GGUF
// through its adapter: the names are the HF names the binder used).
class ImatrixCollector final : public cpu::ActivationObserver {
 public:
  ImatrixCollector(const ModelConfig& c, const ModelWeights& w, const Checkpoint& ckpt);
  void on_linear_input(const WeightMatrix& W, const float* x, int64_t n) override;
  void on_expert_inputs(const MoeWeights& w, int64_t expert, const float* x, const float* h, int64_t m) override;
  void on_mla_absorbed(const MlaWeights& w, const graph::MlaDims& d, const float* q, const float* ol,
                       std::span<const int64_t> rows) override;
  const Imatrix& result() const { return im_; }
  Imatrix& result() { return im_; }
  int64_t matrices_named() const { return static_cast<int64_t>(name_of_.size()); }

 private:
  // Adds `rows` input rows of `cols` values, `stride` apart (0: contiguous), to matrix `mat` of `name`'s n_mat.
  void add(const std::string& name, int64_t mat, int64_t n_mat, const float* x, int64_t rows, int64_t cols,
           int64_t stride = 0);
  std::unordered_map<const void*, std::string> name_of_;  // matrix data -> GGUF name (blk.* only)
  struct ExpertNames {
    std::string gate, up, down;
    int64_t n = 0;
  };
  std::unordered_map<const MoeWeights*, ExpertNames> experts_;
  struct KvbNames {
    std::string k_b, v_b;
  };
  std::unordered_map<const MlaWeights*, KvbNames> kv_b_;
  Imatrix im_;
};

// Writes / reads the GGUF imatrix file. read_imatrix validates shapes and values (finite, counts >= 0)
// and throws k3::Error naming the file and tensor.
void write_imatrix(const Imatrix& im, const std::string& path);
Imatrix read_imatrix(const std::string& path);
// The same over a parsed GGUF (`source` names it in errors): what read_imatrix validates after the container.
struct Gguf;
Imatrix parse_imatrix(const Gguf& g, const std::string& source);

}  // namespace k3
