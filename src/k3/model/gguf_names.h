// The tensor names of llama.cpp's `kimi-k3` / `kimi-linear` GGUFs and their HF checkpoint equivalents (as
// llama.cpp's converter renames them: gguf-py tensor_mapping.py). One table, read both ways: by the GGUF
// loader (GGUF -> the HF names the binder looks up) and by `k3 convert` (HF -> GGUF). Tensors the converter
// transforms rather than renames (experts stacked, kv_b split, A_log, AttnRes fused) are listed with their
// kind; model/gguf_model.cpp and model/gguf_export.cpp do the transform (docs/gguf.md).
#pragma once
#include <optional>
#include <string>

#include "k3/model/config.h"

namespace k3 {

// How a GGUF tensor relates to the HF checkpoint.
enum class GgufTensorKind {
  Rename,       // same data, same shape (reversed dims), another name
  ConvTaps,     // [C][1][W] / [C][W] in HF, ggml ne [W, 1, C, 1]: a reshape
  NegExpALog,   // ssm_a = -exp(A_log[:heads])
  KvbK,         // attn_k_b: kv_b's key rows per head, transposed: [heads][kv_lora][nope]
  KvbV,         // attn_v_b: kv_b's value rows per head: [heads][v_head][kv_lora]
  ResScore,     // <x>_res_norm * <x>_res_proj, fused (hf names the norm; the proj is hf_extra)
  Experts,      // routed experts stacked [E][rows][cols]; hf is "<prefix>experts.{e}.wN.weight" with {e}
};

struct GgufTensorName {
  GgufTensorKind kind = GgufTensorKind::Rename;
  std::string hf;        // the HF tensor name (for ResScore: the _norm half; Experts: with "{e}")
  std::string hf_extra;  // ResScore: the _proj half
};

// The HF side of GGUF tensor `gguf_name` under config c (layer kinds, prefix), or nullopt for a name this
// model does not use.
std::optional<GgufTensorName> gguf_to_hf(const ModelConfig& c, const std::string& gguf_name);

// The GGUF name of HF tensor `hf_name` (nullopt: not written, e.g. vision tensors). For tensors that are
// split (kv_b: attn_k_b), fused (the _proj half) or stacked (each expert) it is the GGUF tensor they end in.
std::optional<std::string> hf_to_gguf(const ModelConfig& c, const std::string& hf_name);

// llama.cpp's architecture name: "kimi-k3" / "kimi-linear".
std::string gguf_arch_name(Arch a);

}  // namespace k3
