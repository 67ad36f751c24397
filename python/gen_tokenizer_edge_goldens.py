#!/usr/bin/env python3
"""Generates tests/data/tokenizer/kimi_edge_goldens.json: tiktoken's encoding (Kimi vocab and pattern) of
long runs and edge-case texts, for test_tokenizer_scanner.cpp (issue 11 item 5).

Texts are stored as recipes, concatenated parts [unit, repeat] or [alphabet, length, seed] (length
characters drawn from alphabet by the LCG below, mirrored in the test), so the file stays small; the ids
as a list when short, else as [count, checksum] (the FNV-1a fold of gen_tokenizer_goldens.py).
Lengths stop at 100,000 characters: tiktoken 0.14 itself overflows its regex stack on 1,000,000 spaces
(RuntimeError(StackOverflow)).
Usage: python3 python/gen_tokenizer_edge_goldens.py   (from the project root; needs tiktoken)"""
import json
import os
import sys
from pathlib import Path

import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_tokenizer_goldens import KIMI_PAT, SHARED, OUT, load_ranks, ids_checksum  # noqa: E402

SHARED = Path(os.environ.get("K3_SHARED_DIR", SHARED.parent)) / "data"


def lcg_text(alphabet, length, seed):
    """length characters of alphabet, picked by a 64-bit LCG (Knuth's MMIX constants)."""
    x, out = seed, []
    for _ in range(length):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(alphabet[(x >> 33) % len(alphabet)])
    return "".join(out)


def text_of(recipe):
    return "".join(p[0] * p[1] if len(p) == 2 else lcg_text(*p) for p in recipe)


def recipes():
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = [
        [["a", 1364]], [["a", 1363]], [["a", 100000]], [["ACGT", 500]], [["ACGT", 25000]],
        [["A", 50000]], [["Hello", 20000]], [[" ", 100000]], [[" ", 99999], ["x", 1]],
        [["\n", 100000]], [["\r\n", 30000]], [[" \n", 30000]], [["\t", 5000], ["x", 1]],
        [["7", 100000]], [["7", 100001]], [["\u00a0", 20000], ["a", 1]],
        [["\u4f60\u597d", 30000]], [["\u3042", 50000]], [["\U0001F600", 20000]], [["\u0301", 20000]],
        [["!", 100000]], [[" !", 20000]], [["'s", 20000]], [["it's ", 10000]],
        [["\u0416\u0436", 20000]], [["a\u0301", 20000]], [["\u01c5", 10000]],
        [["x", 1], [" ", 5000], ["\n", 3], [" ", 5000], ["y", 1]],
        [["\u05e9\u05dc\u05d5\u05dd ", 5000], ["\u0645\u0631\u062d\u0628\u0627 ", 5000], ["\u0928\u092e\u0938\u094d\u0924\u0947 ", 5000]],
        [[letters, 100000, 1]], [[letters + letters.upper(), 50000, 2]], [["ACGT", 100000, 3]],
        [["ab \n1.\u4f60\u3042\U0001F600'\u0301\u00a0\r", 50000, 4]], [["sS'tTrReEvVmMlLdD \u017f", 20000, 5]],
    ]
    return out


def main():
    kimi = tiktoken.Encoding(name="kimi", pat_str=KIMI_PAT,
                             mergeable_ranks=load_ranks(SHARED / "tokenizers" / "kimi" / "tiktoken.model"),
                             special_tokens={})
    cases = []
    for r in recipes():
        ids = kimi.encode_ordinary(text_of(r))
        cases.append({"recipe": r, "ids": ids if len(ids) <= 64 else [len(ids), str(ids_checksum(ids))],
                      "full": len(ids) <= 64})
    with open(OUT / "kimi_edge_goldens.json", "w") as f:
        json.dump({"cases": cases}, f, ensure_ascii=True, separators=(",", ":"))
    print(len(cases), "cases written to", OUT / "kimi_edge_goldens.json")


if __name__ == "__main__":
    main()
