#!/usr/bin/env python3
"""Independent oracle: llama.cpp's `kimi-linear` and `kimi-k3` graphs on the tiny checkpoints (CPU, F32 GGUF;
K3's routed experts stay MXFP4, which the converter repacks losslessly).

Not run by CI. Needs a llama.cpp source tree and a CPU build of its libllama, both OUTSIDE this repository
(no llama.cpp code or build is committed), plus torch / numpy / transformers for its converter:
  cmake -S <llama.cpp> -B /work/llama-build -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF && cmake --build /work/llama-build --target llama
  /work/venv-oracle/bin/python python/oracles/llama_cpp_kimi.py --llama <llama.cpp> --build /work/llama-build \
      --ckpt tiny-kimi-linear      (and again with --ckpt tiny-k3)
Steps: (1) convert the checkpoint with llama.cpp's own convert_hf_to_gguf.py (--outtype f32) into a temp
dir; the tiny checkpoint has no tokenizer files, so the converter's set_vocab is replaced by a stub vocab of
`vocab_size` byte-ish tokens (token ids are fed directly; the vocabulary does not enter the logits);
(2) compile a small dumper against libllama (written to the temp dir, not kept) that decodes the golden
tokens as one batch with logits for every position (prefill) and one token per llama_decode call (decode),
and writes the logits; (3) save them under tests/data/goldens/<ckpt>-llamacpp/ with meta.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

DUMPER = r"""
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>
// usage: dump MODEL.gguf TOKENS.bin N OUT_PREFILL.bin OUT_DECODE.bin
static void die(const char* m) { std::fprintf(stderr, "dump: %s\n", m); std::exit(1); }
int main(int argc, char** argv) {
  if (argc != 6) die("usage");
  const int n = std::atoi(argv[3]);
  std::vector<llama_token> toks(n);
  FILE* f = std::fopen(argv[2], "rb"); if (!f || std::fread(toks.data(), 4, n, f) != (size_t)n) die("tokens"); std::fclose(f);
  llama_backend_init();
  auto mp = llama_model_default_params(); mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp); if (!model) die("load");
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (int mode = 0; mode < 2; ++mode) {
    auto cp = llama_context_default_params(); cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // fp32 cache: no f16 rounding
    llama_context* ctx = llama_init_from_model(model, cp); if (!ctx) die("ctx");
    std::vector<float> out((size_t)n * V);
    const int step = mode == 0 ? n : 1;
    for (int p = 0; p < n; p += step) {
      llama_batch b = llama_batch_init(step, 0, 1);
      for (int i = 0; i < step; ++i) { b.token[i] = toks[p + i]; b.pos[i] = p + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
      b.n_tokens = step;
      if (llama_decode(ctx, b) != 0) die("decode");
      for (int i = 0; i < step; ++i) { const float* l = llama_get_logits_ith(ctx, i); for (int v = 0; v < V; ++v) out[(size_t)(p + i) * V + v] = l[v]; }
      llama_batch_free(b);
    }
    FILE* o = std::fopen(argv[4 + mode], "wb"); std::fwrite(out.data(), 4, out.size(), o); std::fclose(o);
    llama_free(ctx);
  }
  std::printf("%d\n", V);
  llama_model_free(model);
  return 0;
}
"""


def copy_for_converter(ckpt, tmp):
    """A temp copy of the checkpoint. llama.cpp's kimi_k3 converter reads text_config.num_key_value_heads
    to split kv_b_proj per head (before it sets it to 1 for its MQA cache); K3 configs do not have the key
    (the spec has no KV heads: MLA), so the copy gets num_key_value_heads = num_attention_heads, which is
    what the split needs. No weight is touched."""
    import shutil
    dst = os.path.join(tmp, "ckpt")
    shutil.copytree(ckpt, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    added = "num_key_value_heads" not in text
    text.setdefault("num_key_value_heads", text["num_attention_heads"])
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return dst, added


def convert(llama, tmp, ckpt):
    """Runs llama.cpp's converter in-process with the vocabulary stubbed (see the module doc)."""
    sys.path.insert(0, llama)
    sys.path.insert(0, os.path.join(llama, "gguf-py"))
    import gguf  # llama.cpp's own gguf-py
    from conversion import kimi_k3, kimi_linear

    def stub_vocab(self):
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("none")  # LLAMA_VOCAB_TYPE_NONE: ids only
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * n)
        self.gguf_writer.add_bos_token_id(self.hparams.get("bos_token_id", 0))
        self.gguf_writer.add_eos_token_id(self.hparams.get("eos_token_id", 1))
    kimi_linear.KimiLinearModel.set_vocab = stub_vocab
    kimi_k3.KimiK3Model.set_vocab = stub_vocab
    out = os.path.join(tmp, "model-f32.gguf")
    argv = ["convert_hf_to_gguf.py", ckpt, "--outtype", "f32", "--outfile", out]
    sys.argv = argv
    import runpy
    runpy.run_path(os.path.join(llama, "convert_hf_to_gguf.py"), run_name="__main__")
    return out, " ".join(argv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama", required=True, help="llama.cpp source tree (outside the repo)")
    ap.add_argument("--build", required=True, help="its CMake build dir with bin/libllama.so")
    ap.add_argument("--ckpt", default="tiny-kimi-linear", choices=["tiny-kimi-linear", "tiny-k3"])
    a = ap.parse_args()
    ckpt = os.path.join(ROOT, "tests", "data", a.ckpt)
    out_dir = os.path.join(ROOT, "tests", "data", "goldens", a.ckpt + "-llamacpp")
    commit = subprocess.run(["git", "-C", a.llama, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(os.path.join(ROOT, "tests", "data", "goldens", a.ckpt, "tokens.json")) as f:
        toks = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        src_ckpt, added_kv_heads = copy_for_converter(ckpt, tmp)
        gguf_path, conv_cmd = convert(a.llama, tmp, src_ckpt)
        src, exe = os.path.join(tmp, "dump.cpp"), os.path.join(tmp, "dump")
        with open(src, "w") as f:
            f.write(DUMPER)
        lib = os.path.join(a.build, "bin")
        subprocess.run(["c++", "-O2", "-std=c++17", src, "-o", exe, "-I", os.path.join(a.llama, "include"),
                        "-I", os.path.join(a.llama, "ggml", "include"), "-L", lib, "-lllama", "-lggml", "-lggml-base",
                        "-Wl,-rpath," + lib], check=True)
        tb = os.path.join(tmp, "tokens.bin")
        np.asarray(toks, dtype=np.int32).tofile(tb)
        pf, df = os.path.join(tmp, "prefill.bin"), os.path.join(tmp, "decode.bin")
        r = subprocess.run([exe, gguf_path, tb, str(len(toks)), pf, df], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr[-4000:])
        V = int(r.stdout.strip().splitlines()[-1])
        prefill = np.fromfile(pf, dtype=np.float32).reshape(len(toks), V)
        decode = np.fromfile(df, dtype=np.float32).reshape(len(toks), V)
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "logits_prefill.npy"), prefill)
    np.save(os.path.join(out_dir, "logits_decode.npy"), decode)
    rel = lambda x, y: float(np.abs(x - y).max() / np.abs(y).max())  # noqa: E731
    graph = "kimi-k3.cpp (LLM_ARCH_KIMI_K3)" if a.ckpt == "tiny-k3" else "kimi-linear.cpp (LLM_ARCH_KIMI_LINEAR)"
    meta = {"oracle": "llama.cpp src/models/" + graph + ", CPU backend, F32 GGUF", "checkpoint": "tests/data/" + a.ckpt,
            "llama_cpp_commit": commit,
            "llama_cpp_source": "the llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist (PyPI)",
            "convert": conv_cmd + " (vocabulary stubbed: the checkpoint has no tokenizer)",
            "command": "/work/venv-oracle/bin/python python/oracles/llama_cpp_kimi.py --llama <llama.cpp> --build /work/llama-build --ckpt " + a.ckpt,
            "config_added_num_key_value_heads": added_kv_heads,
            "threads": 2, "n_ctx": 256, "kv_cache": "f32 (type_k = type_v = GGML_TYPE_F32), flash attention disabled",
            "files": {"logits_prefill.npy": "one llama_decode of 100 tokens, logits for every position",
                      "logits_decode.npy": "100 llama_decode calls of one token"},
            "prefill_vs_decode_rel": rel(prefill, decode),
            "vs_k3ref_goldens_rel": rel(prefill, np.load(os.path.join(ROOT, "tests", "data", "goldens",
                                                                         a.ckpt, "logits_prefill.npy")))}
    hf = os.path.join(ROOT, "tests", "data", "goldens", a.ckpt + "-hf", "logits_prefill.npy")
    if os.path.exists(hf):
        meta["vs_hf_rel"] = rel(prefill, np.load(hf))
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
