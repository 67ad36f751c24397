"""Shared constants for the k3-tiny data pipeline: Kimi's pre-tokeniser, the special-token table."""
import base64
import hashlib
import json
import os

# Kimi's pat_str (docs/model-spec.md section 5), alternatives in order. `&&` is set intersection.
KIMI_PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

N_RANKS = 7936          # 256 byte tokens + 7680 merges
N_SPECIAL = 256
VOCAB_SIZE = N_RANKS + N_SPECIAL  # 8192

# Offsets into the special range, as in the (unconfirmed) K3 table of model-spec.md section 5.
SPECIAL_OFFSETS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|end_of_msg|>",
    3: "<|open|>",
    4: "<|close|>",
    5: "<|sep|>",
    6: "[start_header_id]",
    7: "[end_header_id]",
    9: "[EOT]",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    254: "[UNK]",
    255: "[PAD]",
}


def shared_dir():
    """The project's shared data: $K3_SHARED, $K3_SHARED_DIR, else ../shared beside the checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.environ.get("K3_SHARED") or os.environ.get("K3_SHARED_DIR") or os.path.join(root, "..", "shared")


def special_tokens(n_ranks=N_RANKS):
    """All 256 special slots: name -> id (unnamed ones are <|reserved_token_ID|>, ID the full id)."""
    out = {}
    for off in range(N_SPECIAL):
        name = SPECIAL_OFFSETS.get(off, f"<|reserved_token_{n_ranks + off}|>")
        out[name] = n_ranks + off
    return out


def split_of(source, name, val_permille=20):
    """Deterministic split: ~2% of the documents of each source go to validation."""
    h = hashlib.sha256(f"{source}\x00{name}".encode()).digest()
    return "val" if int.from_bytes(h[:8], "little") % 1000 < val_permille else "train"


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def make_encoding(model_dir, name="k3-tiny"):
    import tiktoken
    ranks = load_ranks(os.path.join(model_dir, "tiktoken.model"))
    return tiktoken.Encoding(name=name, pat_str=KIMI_PAT_STR, mergeable_ranks=ranks,
                             special_tokens=special_tokens(len(ranks)))


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
