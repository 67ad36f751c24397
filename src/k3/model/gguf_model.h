// A `kimi-k3` / `kimi-linear` GGUF (llama.cpp's converter's output, or `k3 convert`'s) as a model: the
// ModelConfig from its metadata and its tensors seen under the HF checkpoint's names, so that the one
// binder (model/weights.h) validates and binds them. Big tensors stay views into the mapped file; what the
// converter transformed is undone only where that is a small copy (docs/gguf.md):
//   kv_b rebuilt from attn_k_b + attn_v_b (the binder copies kv_b anyway), ssm_a = -exp(A_log) offered as
//   such (exp(A_log) by negation: weights.h kNegExpALogName), AttnRes scores as norm = the fused
//   vector and proj = ones (the binder's product gives the fused bits), conv taps reshaped; routed experts
//   are views of the stacked tensor (MXFP4 in ggml's block: WeightFormat::MXFP4_GGML).
#pragma once
#include <memory>
#include <string>

#include "k3/io/gguf.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"

namespace k3 {

struct GgufModel {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;  // the GGUF's tensors under HF names; keeps the mapping alive
  std::string name;                        // general.name ("" when the file has none)
};

// Throws k3::Error naming the file and the metadata key or tensor for anything missing, mistyped, out of
// range, of an unknown architecture, or of a ggml type k3 cannot run.
GgufModel open_gguf_model(const std::string& path);

// The config alone, from a parsed GGUF (tests, `k3 info`); `source` names the file in messages.
ModelConfig gguf_model_config(const Gguf& g, const std::string& source);

// The adapter alone, over a parsed GGUF (the fuzzer): its tensors under the HF names the binder looks up;
// rebuilt small tensors (kv_b, AttnRes ones) go to `keep`, which must outlive the result. Throws k3::Error.
std::vector<TensorInfo> gguf_tensors_as_hf(const ModelConfig& c, const Gguf& g, const std::string& source,
                                           std::vector<std::vector<uint8_t>>& keep);

// Whether `path` names a GGUF file (a regular file starting with the "GGUF" magic) rather than a directory.
bool is_gguf_path(const std::string& path);

}  // namespace k3
