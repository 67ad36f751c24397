"""A config-only directory for `k3 quantize --load-format dummy`: Kimi-Linear-48B-A3B's true dimensions
(resources/presets/kimi-linear-48b-a3b.json) with its routed experts MXFP4 as K3 ships them (compressed-tensors, the
quantization_config of python/k3ref/checkpoint.py; the real Kimi-Linear ships them BF16 -- quantising 47e9 BF16 expert
weights would take minutes of a device call), and the Kimi tokenizer (vocabulary 163840) copied beside it.
`k3 quantize --load-format dummy [--num-layers N] OUT_DIR F.gguf Q4_K_M` then writes a GGUF of random weights at those
shapes that k3 and llama.cpp both load: the CPU / GPU decode of a 48B-class model without its 98 GB checkpoint.
usage: kl48_dummy_dir.py OUT_DIR TIKTOKEN_MODEL [--bf16-experts]"""
import json, os, shutil, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from k3ref.checkpoint import QUANT_CONFIG

if len(sys.argv) < 3:
    sys.exit(__doc__)
out, tok = sys.argv[1], sys.argv[2]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
with open(os.path.join(root, "resources", "presets", "kimi-linear-48b-a3b.json")) as f:
    cfg = json.load(f)
# The preset states no trained context; llama.cpp does not load a GGUF without <arch>.context_length. Kimi-Linear's
# is 1M tokens (its model card; vLLM's recipe serves it with --max-model-len 1048576).
cfg.setdefault("model_max_length", 1048576)
if "--bf16-experts" not in sys.argv[3:]:
    cfg["quantization_config"] = QUANT_CONFIG
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
shutil.copyfile(tok, os.path.join(out, "tiktoken.model"))
print(out)
