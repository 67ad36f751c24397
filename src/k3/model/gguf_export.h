// An HF checkpoint as llama.cpp's converter writes it for `kimi-k3` / `kimi-linear` (conversion/kimi_k3.py,
// kimi_linear.py): the same metadata keys, tensor names, shapes and transforms, stored types kept (BF16 stays
// BF16, MXFP4 experts repacked to ggml's block; vectors and conv taps as F32, as the converter writes them).
// Every transform is one the GGUF loader undoes bit for bit (model/gguf_model.h), so the GGUF gives the HF
// directory's logits exactly on the CPU. docs/gguf.md lists keys, names and transforms.
#pragma once
#include "k3/io/gguf_writer.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"

#include <optional>
#include <string>
#include <vector>

namespace k3 {

// `--tensor-type REGEX=TYPE` (llama-quantize's flag): a dense matrix whose GGUF name the regex finds
// (std::regex_search, first rule wins) is written quantised to TYPE (model/gguf_export.cpp lists which).
struct TensorTypeRule {
  std::string pattern;
  std::optional<WeightFormat> format;  // nullopt: keep as stored (TYPE "keep")
  bool from_preset = false;            // a preset's rule may match nothing in a given model
};
// Parses "REGEX=TYPE" (TYPE: q8_0, q6_k, q5_k, q4_k, q3_k, q2_k, iq4_xs, or keep; case-insensitive); throws
// k3::Error.
TensorTypeRule parse_tensor_type_rule(const std::string& spec);

struct GgufExportStats {
  int64_t tensors = 0;      // GGUF tensors added
  int64_t hf_skipped = 0;   // HF tensors not written (not part of the text model: vision tower, ...)
  int64_t quantised = 0;    // tensors written quantised by a rule
  int64_t fallbacks = 0;
  int64_t with_importance = 0;  // of the quantised, weighted by the imatrix    // of those, written Q8_0 because their width is not whole 256-element blocks
};

// Adds the model's metadata (general.*, <arch>.*) and every tensor to `w` (streamed at w.write()); the
// checkpoint must outlive the write. Validates the checkpoint against the config first (bind_weights).
// `name` becomes general.name.
// `rules`: dense matrices to quantise (the router, vectors, conv taps, kv_b's halves and routed experts stay as
// stored; a rule naming only such tensors is an error, as is a matrix whose width is not whole blocks).
// `imatrix` (optional): column weights for the quantisers (in_sum2 / count of the matrix's GGUF name).
struct Imatrix;
// A llama-quantize-style preset (Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_M, Q2_K, IQ4_XS; K3 variants with KDA and
// attention kept high: Q4_K_M-KDA8, Q4_K_M-KDA16) as rules; throws k3::Error naming the presets.
std::vector<TensorTypeRule> quantize_preset(const std::string& name);
std::vector<std::string> quantize_preset_names();

// llama.cpp's llama_ftype for a preset (general.file_type: Q4_K_M 15, Q3_K_M 12, ...; the expert presets take their
// experts' type); throws k3::Error for an unknown preset.
uint32_t gguf_file_type_of_preset(const std::string& name);

// `file_type`: general.file_type (a label llama.cpp's tools print); default MOSTLY_MXFP4_MOE (38) with MXFP4 experts,
// else MOSTLY_BF16 (32).
GgufExportStats add_model_to_gguf(GgufWriter& w, const ModelConfig& c, const Checkpoint& ck, const std::string& name,
                                  const std::vector<TensorTypeRule>& rules = {}, const Imatrix* imatrix = nullptr,
                                  std::optional<uint32_t> file_type = std::nullopt);

}  // namespace k3
