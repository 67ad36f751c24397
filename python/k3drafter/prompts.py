#!/usr/bin/env python3
"""Prompt token file for the drafter's self-distillation data (python/k3drafter/data/prompts.bin.gz).

The GPU box that trains the drafter has no ../shared, no tokenizer library and no jinja2, so the prompts are
rendered and tokenised here once and committed as token ids (k3-tiny's vocabulary). Kinds:
  chat   the ShareGPT prompts (ShareGPT_V3_filtered_1000.json, 1000 single user turns) and the MT-Bench
         questions (turn 1; turn 2 with GPT-4's reference answer as the first reply where there is one),
         each rendered with k3-tiny's chat template (= Kimi-K3.jinja) with the generation prompt, once
         with thinking on (the template's default) and once off; [BOS] + tokens with specials, as the
         engine's chat path does (serve/model_chat_adapter.cpp); user text cut to 700 characters
  prose  windows of the public-domain books in ../shared/data/corpora (Austen, KJV): k3-tiny's own training
         text, so the target continues them the way it continues any passage it knows (e.g. quoting)
  code   windows of Python standard library sources (the same kind of text k3-tiny was trained on)
A prose / code entry is a window of WINDOW tokens starting at a line start; gen_data.py uses [BOS] + a random
prefix of it as the prompt.

File layout (all little-endian): b"K3DP", u32 version (1), u32 n, n x u8 kind (0 chat, 1 prose, 2 code),
n x u16 length, then the concatenated u16 token ids; the whole file gzip-compressed.

  python3 python/k3drafter/prompts.py [--shared ../shared] [--out python/k3drafter/data/prompts.bin.gz]
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import random
import struct
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # python/

KINDS = ("chat", "prose", "code")
MAGIC = b"K3DP"
WINDOW = 128
MAX_USER_CHARS = 700


def write_prompts(path, entries):
    """entries: [(kind name, [token ids])]."""
    n = len(entries)
    head = MAGIC + struct.pack("<II", 1, n)
    kinds = bytes(KINDS.index(k) for k, _ in entries)
    lens = struct.pack(f"<{n}H", *(len(t) for _, t in entries))
    toks = b"".join(struct.pack(f"<{len(t)}H", *t) for _, t in entries)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head + kinds + lens + toks)


def read_prompts(path):
    """-> [(kind name, [token ids])] (stdlib only: the GPU box needs nothing else)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:4] != MAGIC:
        raise ValueError(f"{path}: not a K3DP prompt file")
    ver, n = struct.unpack_from("<II", data, 4)
    if ver != 1:
        raise ValueError(f"{path}: version {ver}")
    off = 12
    kinds = data[off:off + n]
    off += n
    lens = struct.unpack_from(f"<{n}H", data, off)
    off += 2 * n
    out = []
    for k, L in zip(kinds, lens):
        out.append((KINDS[k], list(struct.unpack_from(f"<{L}H", data, off))))
        off += 2 * L
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return out


def cut(text, n):
    if len(text) <= n:
        return text
    sp = text.rfind(" ", 0, n)
    return text[:sp if sp > n // 2 else n]


def chat_requests(shared):
    reqs = []
    with open(os.path.join(shared, "data", "prompts", "ShareGPT_V3_filtered_1000.json"), encoding="utf-8") as f:
        for conv in json.load(f):
            turns = [c for c in conv["conversations"] if c["from"] == "human"]
            if turns and turns[0]["value"].strip():
                reqs.append([{"role": "user", "content": cut(turns[0]["value"], MAX_USER_CHARS)}])
    refs = {}
    with open(os.path.join(shared, "data", "prompts", "mt_bench_reference_gpt-4.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            refs[r["question_id"]] = r["choices"][0]["turns"]
    with open(os.path.join(shared, "data", "prompts", "mt_bench_question.jsonl"), encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            t = q["turns"]
            reqs.append([{"role": "user", "content": cut(t[0], MAX_USER_CHARS)}])
            if len(t) > 1 and q["question_id"] in refs:
                reqs.append([{"role": "user", "content": cut(t[0], MAX_USER_CHARS)},
                             {"role": "assistant", "content": cut(refs[q["question_id"]][0], MAX_USER_CHARS)},
                             {"role": "user", "content": cut(t[1], MAX_USER_CHARS)}])
    return reqs


def windows(token_stream_starts, tokens, n, rng):
    """n windows of WINDOW tokens starting at random line starts."""
    starts = [s for s in token_stream_starts if s + WINDOW <= len(tokens)]
    return [tokens[s:s + WINDOW] for s in rng.sample(starts, min(n, len(starts)))]


def line_windows(enc, texts, n, rng):
    """Tokenise each text by lines (so a window starts at a line start), pool the windows, pick n."""
    per = max(1, n // len(texts))
    out = []
    for text in texts:
        toks, starts = [], []
        for line in text.splitlines(keepends=True):
            if line.strip():
                starts.append(len(toks))
            toks.extend(enc.encode_ordinary(line))
        out.extend(windows(starts, toks, per, rng))
    rng.shuffle(out)
    return out[:n]


def main(argv=None):
    from k3tiny.common import make_encoding, shared_dir
    from k3tiny.synth_chat import load_template, render
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=shared_dir())
    ap.add_argument("--target", default="models/k3-tiny")
    ap.add_argument("--out", default=os.path.join(HERE, "data", "prompts.bin.gz"))
    ap.add_argument("--prose", type=int, default=2500)
    ap.add_argument("--code", type=int, default=2500)
    ap.add_argument("--max-chat-tokens", type=int, default=320)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    enc = make_encoding(a.target)
    with open(os.path.join(a.target, "config.json")) as f:
        bos = json.load(f)["bos_token_id"]
    tpl = load_template(os.path.join(a.target, "chat_template.jinja"))
    entries, dropped = [], 0
    for msgs in chat_requests(a.shared):
        for thinking in (True, False):
            text = render(tpl, {"messages": msgs, "thinking": thinking}, add_generation_prompt=True)
            ids = [bos] + enc.encode(text, allowed_special="all")
            if len(ids) > a.max_chat_tokens:
                dropped += 1
                continue
            entries.append(("chat", ids))
    n_chat = len(entries)
    books = sorted(glob.glob(os.path.join(a.shared, "data", "corpora", "*.txt")))
    texts = [open(p, encoding="utf-8", errors="replace").read() for p in books]
    entries += [("prose", w) for w in line_windows(enc, texts, a.prose, rng)]
    stdlib = sysconfig.get_paths()["stdlib"]
    pys = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    code = [open(p, encoding="utf-8", errors="replace").read() for p in pys]
    entries += [("code", w) for w in line_windows(enc, code, a.code, rng)]
    write_prompts(a.out, entries)
    info = {"file": os.path.relpath(a.out), "bytes": os.path.getsize(a.out), "entries": len(entries),
            "chat": n_chat, "chat_dropped_too_long": dropped,
            "prose": sum(k == "prose" for k, _ in entries), "code": sum(k == "code" for k, _ in entries),
            "tokens": sum(len(t) for _, t in entries),
            "sources": {"chat": "ShareGPT_V3_filtered_1000.json + mt_bench_question.jsonl (+ GPT-4 reference "
                                "answers for turn 2), rendered with models/k3-tiny/chat_template.jinja",
                        "prose": [os.path.basename(p) for p in books],
                        "code": f"Python {sys.version.split()[0]} stdlib, {len(pys)} top-level .py files"}}
    with open(os.path.splitext(os.path.splitext(a.out)[0])[0] + ".json", "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
