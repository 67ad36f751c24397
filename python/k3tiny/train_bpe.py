"""Train the k3-tiny byte-level BPE (tiktoken format) on the training split.

Ranks 0..255 are the single bytes (rank == byte value); every later rank is the merge of two
existing tokens, in merge order, so tiktoken's lowest-rank-first merging applies the learned merges.
Pre-tokenisation is Kimi's pat_str (the `regex` module with V1 set operations for `&&`); the
splitting is checked against tiktoken's own regex engine on a sample (see verify_split).

Algorithm: count unique pre-tokens once, then repeat: take the most frequent adjacent pair
(ties: smallest (left id, right id)), merge it in the words that contain it, and update the pair
counts of only those words (pair -> words index + lazy max-heap).

Writes <model>/tiktoken.model, <model>/tokenizer_config.json, <model>/chat_template.jinja.
"""
import argparse
import base64
import collections
import heapq
import json
import multiprocessing as mp
import os
import sys
import time

import regex

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from k3tiny.common import (KIMI_PAT_STR, shared_dir, N_RANKS, SPECIAL_OFFSETS, read_jsonl,  # noqa: E402
                           special_tokens)

PAT = regex.compile(KIMI_PAT_STR, regex.V1)


def count_pieces(texts):
    c = collections.Counter()
    for t in texts:
        c.update(PAT.findall(t))
    return c


def training_texts(path, sources):
    for rec in read_jsonl(path):
        if rec["source"] in sources and "text" in rec:
            yield rec["text"]


def pretoken_counts(texts, workers):
    texts = list(texts)
    if workers <= 1:
        return count_pieces(texts)
    chunks = [texts[i::workers * 4] for i in range(workers * 4)]
    total = collections.Counter()
    with mp.Pool(workers) as pool:
        for c in pool.imap_unordered(count_pieces, chunks):
            total.update(c)
    return total


def train(word_counts, n_merges, log_every=1000):
    """word_counts: {bytes: count}. Returns the list of token bytes for ranks 256.. in order."""
    vocab = [bytes([i]) for i in range(256)]
    id_of = {b: i for i, b in enumerate(vocab)}
    words = []   # list of symbol lists
    freqs = []
    for w, c in word_counts.items():
        if len(w) >= 2:
            words.append(list(w))
            freqs.append(c)
    pair_count = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for wi, (syms, f) in enumerate(zip(words, freqs)):
        for a, b in zip(syms, syms[1:]):
            pair_count[(a, b)] += f
            where[(a, b)].add(wi)
    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)

    merges_done = 0
    t0 = time.time()
    while merges_done < n_merges and heap:
        negc, a, b = heapq.heappop(heap)
        cur = pair_count.get((a, b), 0)
        if cur <= 0:
            continue
        if -negc != cur:  # stale entry; push the current count back
            heapq.heappush(heap, (-cur, a, b))
            continue
        new_bytes = vocab[a] + vocab[b]
        if new_bytes in id_of:  # same bytes reached through another split: reuse the token
            c_id = id_of[new_bytes]
        else:
            c_id = len(vocab)
            vocab.append(new_bytes)
            id_of[new_bytes] = c_id
            merges_done += 1
        changed = set()
        for wi in where.pop((a, b), ()):
            syms = words[wi]
            if len(syms) < 2:
                continue
            # merge left to right
            out, i, hit = [], 0, False
            n = len(syms)
            while i < n:
                if i + 1 < n and syms[i] == a and syms[i + 1] == b:
                    out.append(c_id)
                    i += 2
                    hit = True
                else:
                    out.append(syms[i])
                    i += 1
            if not hit:
                continue
            f = freqs[wi]
            for p in zip(syms, syms[1:]):
                pair_count[p] -= f
                changed.add(p)
            for p in zip(out, out[1:]):
                pair_count[p] += f
                where[p].add(wi)
                changed.add(p)
            words[wi] = out
        pair_count.pop((a, b), None)
        for p in changed:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p[0], p[1]))
            elif p in pair_count:
                del pair_count[p]
        if log_every and merges_done and merges_done % log_every == 0 and c_id == len(vocab) - 1:
            print(f"[bpe] {merges_done} merges, {time.time() - t0:.1f}s, last {new_bytes!r} x{cur}",
                  flush=True)
    return vocab[256:]


def verify_split(texts, n_chars=300_000):
    """Our `regex` split == tiktoken's split of Kimi's pattern. tiktoken exposes no splitter, so
    use the Kimi vocab (many long tokens) when available: encoding each of our pieces separately
    must give exactly tiktoken's ids for the whole text (a wrong boundary changes the ids)."""
    import tiktoken
    kimi = os.path.join(shared_dir(), "data/tokenizers/kimi/tiktoken.model")
    from k3tiny.common import load_ranks
    ranks = load_ranks(kimi)
    enc = tiktoken.Encoding("kimi-check", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    extra = ["Hello, world! I'm you're THEY'LL it's", "你好世界 and 中文English", "1234567890 3.14159",
             "  \n\n\t x\r\n y   z\u00a0 ", "def f(x):\n    return x**2  # ok\n", "ÀÉÎõü naïve café ǅemal",
             "Ωμέγα Привет мир ١٢٣ ٤٥", "emoji 😀👍🏽 mixed", "'S 'T 'Re 'VE 'M 'LL 'D's"]
    total, pieces = 0, 0
    for t in list(texts) + extra:
        t = t[:n_chars]
        ps = PAT.findall(t)
        assert "".join(ps) == t, "pattern does not cover the text"
        ours = [i for p in ps for i in enc._encode_single_piece(p.encode("utf-8"))]
        if ours != enc.encode_ordinary(t):
            raise SystemExit(f"pre-tokeniser split differs from tiktoken on: {t[:200]!r}")
        total += len(t)
        pieces += len(ps)
    return f"split matches tiktoken (Kimi vocab) on {total} chars, {pieces} pieces"


def write_model(model_dir, merged, template_path):
    os.makedirs(model_dir, exist_ok=True)
    all_tokens = [bytes([i]) for i in range(256)] + merged
    assert len(set(all_tokens)) == len(all_tokens)
    with open(os.path.join(model_dir, "tiktoken.model"), "w") as f:
        for rank, tok in enumerate(all_tokens):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
    n = len(all_tokens)
    added = {}
    for off, name in sorted(SPECIAL_OFFSETS.items()):
        added[str(n + off)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": True}
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [SPECIAL_OFFSETS[o] for o in (2, 3, 4, 5, 6, 7, 9)],
        "bos_token": "[BOS]",
        "eos_token": "<|end_of_msg|>",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
        "k3_tiny": {"n_ranks": n, "vocab_size": n + 256, "pat_str": KIMI_PAT_STR},
    }
    assert len(special_tokens(n)) == 256
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(model_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(template)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/k3tiny")
    ap.add_argument("--model", default="models/k3-tiny")
    ap.add_argument("--shared", default=shared_dir())
    ap.add_argument("--n-ranks", type=int, default=N_RANKS)
    ap.add_argument("--sources", default="english,python")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()

    train_path = os.path.join(args.data, "corpus", "train.jsonl")
    sources = set(args.sources.split(","))
    t0 = time.time()
    if not args.no_verify:
        import itertools
        sample = list(itertools.islice(training_texts(os.path.join(args.data, "corpus", "val.jsonl"), sources), 40))
        print(f"[bpe] {verify_split(sample)} ({time.time() - t0:.1f}s)", flush=True)
    t1 = time.time()
    pieces = pretoken_counts(training_texts(train_path, sources), args.workers)
    word_counts = collections.Counter()
    for p, c in pieces.items():
        word_counts[p.encode("utf-8")] += c
    t2 = time.time()
    print(f"[bpe] {sum(word_counts.values())} pre-tokens, {len(word_counts)} unique ({t2 - t1:.1f}s)", flush=True)
    merged = train(word_counts, args.n_ranks - 256)
    t3 = time.time()
    if len(merged) != args.n_ranks - 256:
        raise SystemExit(f"only {len(merged)} merges possible")
    write_model(args.model, merged, os.path.join(args.shared, "data", "chat-templates", "Kimi-K3.jinja"))
    lens = sorted(len(t) for t in merged)
    print(f"[bpe] {args.n_ranks} ranks ({len(merged)} merges) in {t3 - t2:.1f}s; token length median "
          f"{lens[len(lens) // 2]}, max {lens[-1]}; total {time.time() - t0:.1f}s", flush=True)
    with open(os.path.join(args.data, "bpe_stats.json"), "w") as f:
        json.dump({"pretokenize_s": round(t2 - t1, 2), "merge_s": round(t3 - t2, 2),
                   "total_s": round(time.time() - t0, 2), "unique_pretokens": len(word_counts),
                   "pretokens": sum(word_counts.values()), "n_ranks": args.n_ranks}, f, indent=1)


if __name__ == "__main__":
    main()
