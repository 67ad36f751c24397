"""A 32,768-id Kimi tokenizer for the ~1B gate checkpoints (vocab_size 32768): the first 32,512 BPE ranks of the
real Kimi tiktoken.model (a prefix of a BPE's ranks is itself a valid BPE: every merge's parts rank lower) + 256
special slots at 32512..32767 named as the real tokenizer_config names its first ones ([BOS], [EOS],
<|end_of_msg|>, ...). Same layout as tests/data/tiny-tokenizer (which is the first 768 ranks).
usage: make_tok32k.py KIMI_TIKTOKEN_MODEL OUT_DIR [N_RANKS=32512]"""
import json, os, sys

src, out = sys.argv[1], sys.argv[2]
n_ranks = int(sys.argv[3]) if len(sys.argv) > 3 else 32512
with open(src) as f:
    lines = [next(f) for _ in range(n_ranks)]
for i, l in enumerate(lines):
    assert int(l.split()[1]) == i, "ranks must be contiguous"
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "tiktoken.model"), "w") as f:
    f.writelines(lines)
names = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
         6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 254: "[UNK]", 255: "[PAD]"}
added = {str(n_ranks + k): {"content": v, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True} for k, v in names.items()}
cfg = {"added_tokens_decoder": added, "bos_token": "[BOS]",
       "eos_token": {"content": "<|end_of_msg|>", "special": True},
       "model_max_length": 4096, "tokenizer_class": "TikTokenTokenizer"}
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
print(f"{out}: {n_ranks} ranks + 256 specials")
