// An HF checkpoint as llama.cpp's converter writes it for `kimi-k3` / `kimi-linear` (conversion/kimi_k3.py,
// kimi_linear.py): the same metadata keys, tensor names, shapes and transforms, stored types kept (BF16 stays
// BF16, MXFP4 experts repacked to ggml's block; vectors and conv taps as F32, as the converter writes them).
// Every transform is one the GGUF loader undoes bit for bit (model/gguf_model.h), so the GGUF gives the HF
// directory's logits exactly on the CPU. docs/gguf.md lists keys, names and transforms.
#pragma once
#include "k3/io/gguf_writer.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"

namespace k3 {

struct GgufExportStats {
  int64_t tensors = 0;      // GGUF tensors added
  int64_t hf_skipped = 0;   // HF tensors not written (not part of the text model: vision tower, ...)
};

// Adds the model's metadata (general.*, <arch>.*) and every tensor to `w` (streamed at w.write()); the
// checkpoint must outlive the write. Validates the checkpoint against the config first (bind_weights).
// `name` becomes general.name.
GgufExportStats add_model_to_gguf(GgufWriter& w, const ModelConfig& c, const Checkpoint& ck, const std::string& name);

}  // namespace k3
