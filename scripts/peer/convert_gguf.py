#!/usr/bin/env python3
"""Convert a gate checkpoint (k3-1b: kimi_k3, kl-1b: kimi_linear) to GGUF with llama.cpp's OWN converter
(convert_hf_to_gguf.py + gguf-py of the peer tree, outside this repo), keeping the formats: --outtype bf16 for
every non-expert matrix, routed experts repacked from compressed-tensors MXFP4 to ggml MXFP4 (lossless: the
E2M1 codes and E8M0 scales move, no value changes). Three things are adapted here, on the GGUF side only:
 1. vocab: the checkpoint carries a tiktoken.model + tokenizer_config.json (no tokenizer.json and no HF
    remote code), so set_vocab is replaced by the same construction kimi_linear.py's "kimi-k2" branch does
    (byte-level BPE ranks -> gpt2 vocab + merges, pre-tokenizer "kimi-k2"), read from those two files.
 2. num_key_value_heads: kimi_k3.py splits kv_b_proj per KV head before it sets the MQA value 1; K3 configs
    have no such key (MLA), so a temp config gets num_key_value_heads = num_attention_heads (no weight moves).
 3. kimi_linear + MXFP4 experts: kimi_linear.py has no MXFP4 path (the real Kimi-Linear ships BF16 experts),
    so its class borrows kimi_k3.py's lossless repack (same tensor names, same ggml MXFP4 blocks).
With --f32 (the equality check, not the benchmark): every tensor F32, the MXFP4 experts decoded exactly to F32
(E2M1 value x 2^(E8M0-127) is exact in F32), so llama.cpp computes in F32 throughout (its BF16 and MXFP4 matmuls
round the activations to BF16 / Q8_0 first).
usage: convert_gguf.py LLAMA_SRC CKPT_DIR OUT.gguf [--f32]"""
import json, os, runpy, sys, tempfile, base64

llama, ckpt, out = sys.argv[1:4]
F32 = "--f32" in sys.argv[4:]
sys.path.insert(0, llama)
sys.path.insert(0, os.path.join(llama, "gguf-py"))
import gguf  # noqa: E402  the peer tree's gguf-py
from conversion import kimi_k3, kimi_linear  # noqa: E402
from conversion.qwen import QwenModel  # noqa: E402


def tiktoken_vocab(self):
    d = self.dir_model
    ranks = {}
    with open(os.path.join(d, "tiktoken.model")) as f:
        for line in f:
            tok, r = line.split()
            ranks[base64.b64decode(tok)] = int(r)
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        tcfg = json.load(f)
    n_ranks, V = len(ranks), self.hparams["vocab_size"]
    names = {int(k): v["content"] for k, v in tcfg.get("added_tokens_decoder", {}).items()}
    tokens, types, merges = [], [], []
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    for tok, r in by_rank:
        tokens.append(QwenModel.token_bytes_to_string(tok))
        types.append(gguf.TokenType.NORMAL)
        if len(tok) > 1:
            m = QwenModel.bpe(ranks, tok, max_rank=r)
            assert len(m) == 2, (tok, m)
            merges.append(" ".join(map(QwenModel.token_bytes_to_string, m)))
    for i in range(n_ranks, V):  # tokenization_kimi.py: unnamed special slots are <|reserved_token_i|>
        tokens.append(names.get(i, f"<|reserved_token_{i}|>"))
        types.append(gguf.TokenType.CONTROL)
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(self.hparams["bos_token_id"])
    w.add_eos_token_id(self.hparams["eos_token_id"])
    w.add_pad_token_id(self.hparams.get("pad_token_id", V - 1))
    w.add_add_bos_token(True)  # k3 run prepends BOS too


kimi_linear.KimiLinearModel.set_vocab = tiktoken_vocab
K3 = kimi_k3.KimiK3Model
with open(os.path.join(ckpt, "config.json")) as f:  # BF16 experts (the real Kimi-Linear's): nothing to borrow
    _mxfp4 = "quantization_config" in json.load(f)
for name in ("_MXFP4_FORMAT", "_MXFP4_EXPERT_RE", "_MXFP4_PROJ", "_is_mxfp4_packed", "dequant_model",
             "_write_mxfp4_experts", "generate_extra_tensors") if _mxfp4 else ():
    setattr(kimi_linear.KimiLinearModel, name, K3.__dict__[name])


def mxfp4_to_f32(packed, scale):
    import torch
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    p = packed.to(torch.int64)
    codes = torch.stack((p & 15, p >> 4), dim=-1).reshape(p.shape[0], p.shape[1] * 2)
    vals = torch.take(table, codes).reshape(p.shape[0], -1, 32)
    mult = torch.exp2(scale.to(torch.float32) - 127.0).unsqueeze(-1)
    return (vals * mult).reshape(p.shape[0], p.shape[1] * 2)


def dequant_f32(self):
    for name in [n for n in self.model_tensors if n.endswith(".weight_packed")]:
        base = name.removesuffix("_packed")
        pk, sc = self.model_tensors.pop(name), self.model_tensors.pop(base + "_scale")
        self.model_tensors[base] = lambda pk=pk, sc=sc: mxfp4_to_f32(pk(), sc())


if F32:
    for cls in (K3, kimi_linear.KimiLinearModel):
        cls.dequant_model = dequant_f32
        cls._is_mxfp4_packed = lambda self: False
_kl_prepare = kimi_linear.KimiLinearModel.prepare_tensors


def kl_prepare(self):
    _kl_prepare(self)
    if _mxfp4 and self._is_mxfp4_packed():
        self._is_mxfp4 = True
        self.ftype = gguf.LlamaFileType.MOSTLY_MXFP4_MOE


kimi_linear.KimiLinearModel.prepare_tensors = kl_prepare

with tempfile.TemporaryDirectory() as tmp:
    for f in os.listdir(ckpt):
        if f != "config.json":
            os.symlink(os.path.abspath(os.path.join(ckpt, f)), os.path.join(tmp, f))
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    text.setdefault("num_key_value_heads", text["num_attention_heads"])
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    sys.argv = ["convert_hf_to_gguf.py", tmp, "--outtype", "f32" if F32 else "bf16", "--outfile", out]
    runpy.run_path(os.path.join(llama, "convert_hf_to_gguf.py"), run_name="__main__")
