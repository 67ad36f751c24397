"""Check the C++ tokenizer (`k3 tokenize -m models/k3-tiny`) against Python tiktoken.

Samples: every validation document (English and Python via encode_ordinary; XTML chat examples
via --special, i.e. with their control markers as special tokens), random slices of
val_english.txt / val_python.txt (arbitrary cut points), the two whole val files, and a few
edge cases. For each: ids must be identical, and `k3 tokenize --decode` must give back the bytes.
Also checks the special ids and the vocab size reported by the config. Exit status 1 on mismatch.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from k3tiny.common import N_RANKS, make_encoding, read_jsonl, special_tokens  # noqa: E402


def k3_encode(k3, model, text, special=False):
    cmd = [k3, "tokenize", "-m", model] + (["--special"] if special else [])
    r = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, check=True)
    return json.loads(r.stdout)


def k3_decode(k3, model, ids):
    r = subprocess.run([k3, "tokenize", "-m", model, "--decode"], input=json.dumps(ids).encode(),
                       capture_output=True, check=True)
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k3", default="build/release/k3")
    ap.add_argument("--model", default="models/k3-tiny")
    ap.add_argument("--data", default="data/k3tiny")
    ap.add_argument("--slices", type=int, default=120)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    enc = make_encoding(args.model)
    specials = special_tokens(N_RANKS)
    cases = []  # (label, text, allow_special)
    for rec in read_jsonl(os.path.join(args.data, "corpus", "val.jsonl")):
        if "text" in rec:
            cases.append((f'{rec["source"]}/{rec["name"]}', rec["text"], False))
        else:
            cases.append((rec["name"], "".join(t for _, t in rec["segments"]), True))
    rng = random.Random(args.seed)
    for src in ("english", "python"):
        with open(os.path.join(args.data, f"val_{src}.txt"), encoding="utf-8") as f:
            whole = f.read()
        cases.append((f"val_{src}.txt", whole, False))
        for i in range(args.slices // 2):
            a = rng.randrange(len(whole))
            cases.append((f"val_{src}.txt[{a}:]", whole[a:a + rng.randint(1, 3000)], False))
    cases += [("edge/empty", "", False), ("edge/specials-as-text", "[BOS]<|open|>x<|sep|>", False),
              ("edge/specials", "[BOS]<|open|>message<|sep|>hi<|close|>message<|sep|><|end_of_msg|>", True),
              ("edge/unicode", "naïve café — “quotes” 你好世界 😀 Ωμέγα ١٢٣", False),
              ("edge/whitespace", "  \n\n\t\r\n   x  \n ", False)]

    n_ok = n_bad = 0
    by_kind = {}
    for label, text, special in cases:
        want = enc.encode(text, allowed_special="all") if special else enc.encode_ordinary(text)
        got = k3_encode(args.k3, args.model, text, special)
        back = k3_decode(args.k3, args.model, got)
        ok = got == want and back == text.encode("utf-8")
        kind = label.split("/")[0].split("[")[0]
        k = by_kind.setdefault(kind, [0, 0])
        k[0 if ok else 1] += 1
        if ok:
            n_ok += 1
        else:
            n_bad += 1
            first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            print(f"MISMATCH {label}: k3 {len(got)} ids, tiktoken {len(want)}, first diff at {first}, "
                  f"round trip {'ok' if back == text.encode() else 'FAILED'}")
    # special ids as the C++ side resolves them
    probe = "[BOS][EOS]<|end_of_msg|><|open|><|close|><|sep|>[UNK][PAD]"
    got = k3_encode(args.k3, args.model, probe, special=True)
    want = [specials[n] for n in ("[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "[UNK]", "[PAD]")]
    if got != want:
        print(f"MISMATCH special ids: k3 {got}, expected {want}")
        n_bad += 1
    print("[check] " + ", ".join(f"{k}: {v[0]} ok / {v[1]} bad" for k, v in sorted(by_kind.items())))
    print(f"[check] {n_ok}/{n_ok + n_bad} samples identical ids + decode round trip; special ids {want[:4]}... "
          f"{'ok' if got == want else 'BAD'}")
    sys.exit(1 if n_bad else 0)


if __name__ == "__main__":
    main()
