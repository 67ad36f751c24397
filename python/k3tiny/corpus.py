"""Collect the k3-tiny training text and split it into train / val documents.

Sources
  english  public-domain books in <shared>/data/corpora/*.txt (Jane Austen novels, KJV Bible);
           one document per chapter (Gutenberg licence header/footer stripped if present)
  python   CPython standard library sources (PSF licence), one document per .py file,
           test suites, site-/dist-packages and generated files excluded, sorted path order
  chat     short XTML chat examples (Kimi-K3.jinja format) built from the book text: "continue
           the story / passage"; each inherits the split of the chapter it was taken from; plus the
           synthetic reasoning / tool-call / plain examples of synth_chat.py (rendered with jinja2)

Writes <out>/corpus/{train,val}.jsonl ({"source","name","text"} or, for chat, {"source","name",
"segments": [[is_special, text], ...]}), <out>/val_english.txt, <out>/val_python.txt and
<out>/corpus/manifest.json.
"""
import argparse
import hashlib
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from k3tiny.common import shared_dir, split_of  # noqa: E402

GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
CHAPTER_RE = re.compile(r"^[ \t]*(?:CHAPTER|Chapter)[ \t]+[IVXLC0-9]+\.?[ \t]*$", re.M)
KJV_RE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")

EXCLUDE_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def strip_gutenberg(text):
    m = GUTENBERG_START.search(text)
    if m:
        text = text[m.end():]
    m = GUTENBERG_END.search(text)
    if m:
        text = text[:m.start()]
    return text


def norm_doc(text):
    text = text.replace("\r\n", "\n").strip("\n")
    return re.sub(r"\n{4,}", "\n\n\n", text) + "\n"


def book_docs(path):
    """(name, text) per chapter; the KJV (verse-per-line) one per book chapter."""
    stem = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_gutenberg(f.read())
    lines = text.splitlines()
    if lines and sum(bool(KJV_RE.match(l)) for l in lines if l.strip()) > 0.95 * sum(1 for l in lines if l.strip()):
        docs, cur, key = [], [], None
        for line in lines:
            m = KJV_RE.match(line)
            if not m:
                continue
            k = (m.group(1), int(m.group(2)))
            if k != key and cur:
                docs.append((f"{stem}/{key[0]}{key[1]}", "\n".join(cur)))
                cur = []
            key = k
            cur.append(line)
        if cur:
            docs.append((f"{stem}/{key[0]}{key[1]}", "\n".join(cur)))
        return [(n, norm_doc(t)) for n, t in docs]
    starts = [m.start() for m in CHAPTER_RE.finditer(text)]
    bounds = [0] + starts + [len(text)]
    docs = []
    for i in range(len(bounds) - 1):
        chunk = text[bounds[i]:bounds[i + 1]]
        if chunk.strip():
            docs.append((f"{stem}/{i:03d}", norm_doc(chunk)))
    return docs


def is_generated_codec(text):
    return "generated from" in text[:600] and "gencodec.py" in text[:600]


def python_docs(stdlib):
    paths = []
    for root, dirs, files in os.walk(stdlib):
        rel = os.path.relpath(root, stdlib)
        parts = [] if rel == "." else rel.split(os.sep)
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDE_DIRS)
        if any(p in EXCLUDE_DIRS for p in parts):
            continue
        for fn in files:
            if fn.endswith(".py") and not fn.startswith("_sysconfigdata"):
                paths.append(os.path.join(rel, fn) if parts else fn)
    docs = []
    for rel in sorted(paths):
        full = os.path.join(stdlib, rel)
        if os.path.islink(full):
            continue
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or is_generated_codec(text):
            continue
        docs.append((f"stdlib/{rel}", text.replace("\r\n", "\n")))
    return docs


# ---- XTML chat examples -------------------------------------------------------------------------

SENT_RE = re.compile(r"(?<=[.!?])[\"']?\s+(?=[\"']?[A-Z])")


def xtml_chat(user, assistant, thinking):
    """Segments of Kimi-K3.jinja rendered for [user, assistant] (thinking_effort=max when thinking)."""
    segs = []

    def sp(name):
        segs.append([True, name])

    def tx(text):
        if segs and not segs[-1][0]:
            segs[-1][1] += text
        else:
            segs.append([False, text])

    def open_tag(tag, attrs=()):
        sp("<|open|>")
        tx(tag + "".join(f' {k}="{v}"' for k, v in attrs))
        sp("<|sep|>")

    def close_tag(tag):
        sp("<|close|>")
        tx(tag)
        sp("<|sep|>")

    if thinking:
        open_tag("message", [("role", "system"), ("type", "thinking-effort")])
        tx("`thinking_effort` guides on how much to think in your thinking channel (not including the "
           "response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the "
           "system is invoked with `thinking_effort=max`.")
        close_tag("message")
        sp("<|end_of_msg|>")
    open_tag("message", [("role", "user")])
    tx(user)
    close_tag("message")
    sp("<|end_of_msg|>")
    open_tag("message", [("role", "assistant")])
    if thinking:
        open_tag("think")
        close_tag("think")
    open_tag("response")
    tx(assistant)
    close_tag("response")
    close_tag("message")
    sp("<|end_of_msg|>")
    return segs


def check_against_jinja(template_path, n=4):
    """Render a few examples with the real template (if jinja2 is installed) and compare."""
    try:
        import jinja2
    except ImportError:
        return "jinja2 not installed: template check skipped"
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    with open(template_path, encoding="utf-8") as f:
        tpl = env.from_string(f.read())
    for i in range(n):
        u, a, th = f"Continue the story: It was {i}.", f"And then {i} \"more\".", bool(i % 2)
        ref = tpl.render(messages=[{"role": "user", "content": u}, {"role": "assistant", "content": a}],
                         thinking=th)
        ours = "".join(t for _, t in xtml_chat(u, a, th))
        if ref != ours:
            raise SystemExit(f"XTML rendering differs from {template_path}:\n{ref!r}\n{ours!r}")
    return f"XTML rendering matches {os.path.basename(template_path)} ({n} examples)"


def chat_examples(book_docs_by_split, rng, n_story, n_passage):
    """Continuation tasks from book paragraphs (prose) and verses (KJV)."""
    story, passage = [], []
    for split, name, text in book_docs_by_split:
        if "/" in name and name.startswith("kjv/"):
            verses = [KJV_RE.match(l).group(4) for l in text.splitlines() if KJV_RE.match(l)]
            for i in range(0, len(verses) - 2, 3):
                passage.append((split, name, i, verses[i], " ".join(verses[i + 1:i + 3])))
        else:
            for j, para in enumerate(re.split(r"\n\s*\n", text)):
                para = " ".join(para.split())
                if len(para) > 1200 or "CHAPTER" in para.upper()[:12]:
                    continue
                sents = SENT_RE.split(para)
                if len(sents) >= 3 and all(8 <= len(s) <= 400 for s in sents[:4]):
                    story.append((split, name, j, sents[0], " ".join(sents[1:4])))
    rng.shuffle(story)
    rng.shuffle(passage)
    out = []
    for k, (split, name, j, first, rest) in enumerate(story[:n_story] + passage[:n_passage]):
        is_kjv = name.startswith("kjv/")
        prompt = ("Continue the passage: " if is_kjv else "Continue the story: ") + first
        out.append((split, {"source": "chat", "name": f"chat/{name}#{j}",
                            "segments": xtml_chat(prompt, rest, thinking=(k % 2 == 1))}))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=shared_dir())
    ap.add_argument("--stdlib", default="/usr/lib/python3.11")
    ap.add_argument("--out", default="data/k3tiny")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--chat-story", type=int, default=300)
    ap.add_argument("--chat-passage", type=int, default=100)
    ap.add_argument("--synth-reason", type=int, default=1300)
    ap.add_argument("--synth-tool", type=int, default=1100)
    ap.add_argument("--synth-plain", type=int, default=800)
    args = ap.parse_args()

    corp_dir = os.path.join(args.shared, "data", "corpora")
    template = os.path.join(args.shared, "data", "chat-templates", "Kimi-K3.jinja")
    os.makedirs(os.path.join(args.out, "corpus"), exist_ok=True)

    records = []  # (split, record)
    inputs = {}
    book_for_chat = []
    for fn in sorted(os.listdir(corp_dir)):
        if not fn.endswith(".txt"):
            continue
        path = os.path.join(corp_dir, fn)
        inputs[path] = hashlib.sha256(open(path, "rb").read()).hexdigest()
        for name, text in book_docs(path):
            split = split_of("english", name)
            records.append((split, {"source": "english", "name": name, "text": text}))
            book_for_chat.append((split, name, text))
    py = python_docs(args.stdlib)
    h = hashlib.sha256()
    for name, text in py:
        split = split_of("python", name)
        records.append((split, {"source": "python", "name": name, "text": text}))
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    inputs[args.stdlib + "/**.py"] = h.hexdigest()

    msg = check_against_jinja(template) if os.path.exists(template) else "template not found"
    print(f"[corpus] {msg}")
    if args.chat_story + args.chat_passage > 0:
        records += chat_examples(book_for_chat, random.Random(args.seed), args.chat_story, args.chat_passage)
    if args.synth_reason + args.synth_tool + args.synth_plain > 0:
        from k3tiny.synth_chat import synth_records  # needs jinja2: rendered with the real template
        records += synth_records(args.shared, args.seed + 1, n_reason=args.synth_reason,
                                 n_tool=args.synth_tool, n_plain=args.synth_plain)

    stats = {}
    fh = {s: open(os.path.join(args.out, "corpus", f"{s}.jsonl"), "w", encoding="utf-8") for s in ("train", "val")}
    val_text = {"english": [], "python": []}
    for split, rec in records:
        fh[split].write(json.dumps(rec, ensure_ascii=False) + "\n")
        text = rec.get("text") or "".join(t for _, t in rec["segments"])
        st = stats.setdefault(rec["source"], {}).setdefault(split, {"documents": 0, "bytes": 0})
        st["documents"] += 1
        st["bytes"] += len(text.encode("utf-8"))
        if split == "val" and rec["source"] in val_text:
            val_text[rec["source"]].append(text)
    for f in fh.values():
        f.close()
    for src, texts in val_text.items():
        with open(os.path.join(args.out, f"val_{src}.txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(t.rstrip("\n") for t in texts) + "\n")
    manifest = {"seed": args.seed, "stdlib": args.stdlib, "inputs_sha256": inputs, "stats": stats,
                "template_check": msg}
    with open(os.path.join(args.out, "corpus", "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    for src, d in stats.items():
        print(f"[corpus] {src:8s} " + "  ".join(
            f"{s}: {v['documents']} docs {v['bytes'] / 1e6:.2f} MB" for s, v in sorted(d.items())))


if __name__ == "__main__":
    main()
