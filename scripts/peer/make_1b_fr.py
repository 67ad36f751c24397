"""k3-1b-fr: k3-1b (make_1b.py) with the full-rank KDA gate, as the real Kimi K3 has it
(linear_attn_config.use_full_rank_gate = true: self_attn.g_proj [16*128, 2048] in place of the low-rank
g_a_proj [128, 2048] / g_b_proj [2048, 128]). llama.cpp's kimi-k3 graph only has the full-rank gate, so this is
the K3-architecture model both engines can run. Every other tensor is copied bit for bit from k3-1b; the new
g_proj is BF16, N(0, 1/2048) (the generator's G.lin gain), seed 1111. Needs k3-1b (make_1b.py) first.
usage: make_1b_fr.py [SRC=/work/gate/k3-1b] [OUT=/work/gate/k3-1b-fr]"""
import json, math, os, subprocess, sys
from collections import OrderedDict
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from k3ref.safetensors_io import BF16Array, read_file, write_sharded

SRC = sys.argv[1] if len(sys.argv) > 1 else "/work/gate/k3-1b"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/work/gate/k3-1b-fr"
cfg = json.load(open(os.path.join(SRC, "config.json")), object_pairs_hook=OrderedDict)
t = cfg["text_config"]
lac = t["linear_attn_config"]
assert lac["use_full_rank_gate"] is False
lac["use_full_rank_gate"] = True
H, Hk, D = t["hidden_size"], lac["num_heads"], lac["head_dim"]
wm = json.load(open(os.path.join(SRC, "model.safetensors.index.json")))["weight_map"]
tensors = OrderedDict()
for fn in sorted(set(wm.values())):
    part, _ = read_file(os.path.join(SRC, fn))
    tensors.update(part)
rng = np.random.default_rng(1111)
for L in range(t["num_hidden_layers"]):
    a = f"language_model.model.layers.{L}.self_attn."
    if a + "g_a_proj.weight" in tensors:
        del tensors[a + "g_a_proj.weight"], tensors[a + "g_b_proj.weight"]
        tensors[a + "g_proj.weight"] = BF16Array.from_f32(rng.standard_normal((Hk * D, H)) / math.sqrt(H))
os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
ordered = OrderedDict(sorted(tensors.items(), key=lambda kv: (int(kv[0].split("layers.")[1].split(".")[0])
                                                          if "layers." in kv[0] else -1, kv[0])))
write_sharded(OUT, ordered, 2)
subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_tok32k.py"),
                os.path.join(os.environ.get("K3_SHARED_DIR", "/work/shared"), "data", "tokenizers", "kimi", "tiktoken.model"), OUT], check=True)
print("ok")
