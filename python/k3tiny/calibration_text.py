#!/usr/bin/env python3
"""Calibration text for `k3 imatrix --parse-special` / `k3 prune --parse-special`: chat-formatted data, not only prose.

  python3 python/k3tiny/calibration_text.py --shared ../shared --corpus data/k3tiny/corpus/train.jsonl -o calib.txt

Writes, in this order (each part's size is printed):
  1. --sharegpt N conversations of shared/data/prompts/ShareGPT_V3_filtered_1000.json (the first N with a human
     turn, in file order) rendered with the real Kimi-K3.jinja (thinking off: ShareGPT has no reasoning), so the
     markers (<|open|>, <|sep|>, ...) are the ones the server's chat rendering produces -- with --parse-special they
     tokenise as their ids;
  2. the first --chat N chat records of the training split (k3-tiny's synthetic reasoning / tool-call chats,
     already rendered with the same template: their segments joined);
  3. the first --prose BYTES of the training split's English documents and --code BYTES of its Python files,
     whole documents, in corpus order.
Only training-split text: evaluation text (val_english.txt, val_python.txt) stays unseen by the calibration.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from k3tiny.synth_chat import load_template, render  # noqa: E402


def sharegpt_chats(shared, n, tpl):
    with open(os.path.join(shared, "data", "prompts", "ShareGPT_V3_filtered_1000.json"), encoding="utf-8") as f:
        convs = json.load(f)
    roles = {"human": "user", "gpt": "assistant"}
    out = []
    for c in convs:
        msgs = [{"role": roles[t["from"]], "content": t["value"]} for t in c.get("conversations", [])
                if t.get("from") in roles and t.get("value")]
        if not msgs or msgs[0]["role"] != "user":
            continue
        out.append(render(tpl, {"messages": msgs, "thinking": False}))
        if len(out) == n:
            break
    return out


def corpus_parts(path, n_chat, prose_bytes, code_bytes):
    chat, prose, code = [], [], []
    left = {"english": prose_bytes, "python": code_bytes}
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            src = r["source"]
            if src == "chat" and len(chat) < n_chat:
                chat.append("".join(text for _, text in r["segments"]))
            elif src in left and left[src] > 0:
                (prose if src == "english" else code).append(r["text"])
                left[src] -= len(r["text"].encode("utf-8"))
    return chat, prose, code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=os.environ.get("K3_SHARED_DIR", "../shared"))
    ap.add_argument("--corpus", default="data/k3tiny/corpus/train.jsonl", help="scripts/k3tiny-data's training split")
    ap.add_argument("--sharegpt", type=int, default=40)
    ap.add_argument("--chat", type=int, default=60)
    ap.add_argument("--prose", type=int, default=30000)
    ap.add_argument("--code", type=int, default=30000)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    tpl = load_template(os.path.join(a.shared, "data", "chat-templates", "Kimi-K3.jinja"))
    parts = [("sharegpt", sharegpt_chats(a.shared, a.sharegpt, tpl))]
    chat, prose, code = corpus_parts(a.corpus, a.chat, a.prose, a.code)
    parts += [("synthetic chat", chat), ("prose", prose), ("code", code)]
    with open(a.out, "w", encoding="utf-8") as f:
        for name, docs in parts:
            text = "\n\n".join(docs) + "\n\n"
            f.write(text)
            print(f"{name}: {len(docs)} documents, {len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main()
