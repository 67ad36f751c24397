"""Encode the train / val splits with tiktoken (k3-tiny ranks + Kimi pat_str + K3 specials).

Output: <data>/train.bin, <data>/val.bin -- little-endian uint16 ids, each document
[BOS] + tokens + [EOS] (text via encode_ordinary; chat examples: their XTML control markers as
explicit special ids, the text between them via encode_ordinary), documents in corpus order;
<data>/meta.json -- vocab, special ids, token counts per split and source, input hashes.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from k3tiny.common import N_SPECIAL, make_encoding, read_jsonl, sha256_file, special_tokens  # noqa: E402


def encode_record(enc, specials, rec):
    if "text" in rec:
        return enc.encode_ordinary(rec["text"])
    ids = []
    for is_special, text in rec["segments"]:
        if is_special:
            ids.append(specials[text])
        else:
            ids.extend(enc.encode_ordinary(text))
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/k3tiny")
    ap.add_argument("--model", default="models/k3-tiny")
    args = ap.parse_args()

    t0 = time.time()
    enc = make_encoding(args.model)
    n_ranks = enc.max_token_value + 1 - N_SPECIAL
    specials = special_tokens(n_ranks)
    bos, eos, pad = specials["[BOS]"], specials["[EOS]"], specials["[PAD]"]
    vocab_size = n_ranks + N_SPECIAL
    assert vocab_size <= 65536
    meta = {"vocab_size": vocab_size, "n_ranks": n_ranks, "dtype": "uint16", "byteorder": "little",
            "bos_id": bos, "eos_id": eos, "pad_id": pad, "end_of_msg_id": specials["<|end_of_msg|>"],
            "open_id": specials["<|open|>"], "close_id": specials["<|close|>"], "sep_id": specials["<|sep|>"],
            "document_format": "[BOS] + tokens + [EOS]", "splits": {}, "sha256": {}}
    for split in ("train", "val"):
        src = os.path.join(args.data, "corpus", f"{split}.jsonl")
        per_source = {}
        arrays = []
        buf = []
        for rec in read_jsonl(src):
            ids = encode_record(enc, specials, rec)
            text_bytes = len((rec.get("text") or "".join(t for _, t in rec["segments"])).encode("utf-8"))
            s = per_source.setdefault(rec["source"], {"documents": 0, "tokens": 0, "bytes": 0})
            s["documents"] += 1
            s["tokens"] += len(ids) + 2
            s["bytes"] += text_bytes
            buf.append(bos)
            buf.extend(ids)
            buf.append(eos)
            if len(buf) > 1 << 20:
                arrays.append(np.asarray(buf, dtype="<u2"))
                buf = []
        arrays.append(np.asarray(buf, dtype="<u2"))
        out = np.concatenate(arrays)
        assert int(out.max()) < vocab_size
        path = os.path.join(args.data, f"{split}.bin")
        out.tofile(path)
        for s in per_source.values():
            s["bytes_per_token"] = round(s["bytes"] / max(1, s["tokens"] - 2 * s["documents"]), 4)
        meta["splits"][split] = {"tokens": int(out.size), "documents": sum(s["documents"] for s in per_source.values()),
                                 "sources": per_source}
        meta["sha256"][f"corpus/{split}.jsonl"] = sha256_file(src)
        meta["sha256"][f"{split}.bin"] = sha256_file(path)
        print(f"[tokenize] {split}: {out.size} tokens -> {path} ({os.path.getsize(path) / 1e6:.1f} MB)", flush=True)
    for name in ("tiktoken.model", "tokenizer_config.json"):
        meta["sha256"][f"models/k3-tiny/{name}"] = sha256_file(os.path.join(args.model, name))
    manifest = os.path.join(args.data, "corpus", "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            meta["inputs_sha256"] = json.load(f)["inputs_sha256"]
    for f in ("val_english.txt", "val_python.txt"):
        p = os.path.join(args.data, f)
        if os.path.exists(p):
            meta["sha256"][f] = sha256_file(p)
            meta[f] = {"bytes": os.path.getsize(p),
                       "tokens": len(enc.encode_ordinary(open(p, encoding="utf-8").read()))}
    meta["tokenize_s"] = round(time.time() - t0, 2)
    with open(os.path.join(args.data, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
