#!/usr/bin/env python3
"""Generates the tokenizer goldens for tests/unit/test_tokenizer*.cpp with tiktoken.

Deterministic (seeded). Writes, under tests/data/tokenizer/:
  kimi_goldens.json    {"texts", "ids" (encode_ordinary), "special_texts", "special_ids"
                        (allowed_special='all' with the K3 table of k3_tokenizer_config.json),
                        "lossy": [[hex bytes, bytes.decode('utf-8', 'replace')], ...],
                        "corpora": {file: [n_tokens, checksum string]} for ../shared corpora}
  cl100k_goldens.json  {"texts", "ids"}   (OpenAI cl100k_base, a second vocab + pattern)
  kimi_classes.json    per regex atom, the code point ranges tiktoken's regex engine puts in it
Usage: python3 python/gen_tokenizer_goldens.py   (from the project root; needs tiktoken)
"""
import sys
import base64
import json
import random
import unicodedata
from pathlib import Path

import tiktoken

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "tests" / "data" / "tokenizer"

# Exactly Kimi's pat_str (tokenization_kimi.py); tiktoken supports && natively. One copy, in k3tiny.common.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from k3tiny.common import KIMI_PAT_STR as KIMI_PAT  # noqa: E402

# tiktoken_ext.openai_public cl100k_base pat_str.
CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""


def load_ranks(path):
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def kimi_specials(n_ranks):
    cfg = json.load(open(OUT / "k3_tokenizer_config.json"))
    named = {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()}
    # tokenization_kimi.py convention: the reserved name carries the full id.
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_ranks, n_ranks + 256)}


def rand_scalar(rng, planes):
    plane = rng.choice(planes)
    while True:
        cp = plane * 0x10000 + rng.randrange(0x10000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def rand_range(rng, lo, hi, n):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def corpus_texts(rng, n):
    files = sorted((SHARED / "corpora").glob("*.txt"))
    data = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    out = []
    for i in range(n):
        d = rng.choice(data)
        start = rng.randrange(len(d) - 3000)
        start = d.find("\n", start) + 1
        length = rng.choice([40, 120, 400, 1200])
        out.append(d[start:start + length])
    return out


CODE = [
    "def f(x):\n    return x**2 + 3*x - 1  # poly\n\nprint(f(10))\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);return 0;}",
    "class Foo(Bar):\n    def __init__(self, *args, **kw):\n        super().__init__(*args, **kw)\n        self._x = {'a': [1, 2, 3]}\n",
    "if (x != NULL && x->next) { x = x->next; } else { x = head; }  // TODO",
    "    \n        \n\t\tindented_block()\r\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 100;",
    "const std::vector<std::pair<int, float>>& v = m.at(\"key\"); auto [a, b] = v[0];",
    "x = [i for i in range(1000) if i % 7 == 0]; y = {k: v for k, v in zip(x, x[1:])}",
    "<div class=\"a\"><p>Hello &amp; welcome</p></div>\n<!-- comment -->",
    "fn main() -> Result<(), Box<dyn Error>> { let s = String::from(\"hi\"); Ok(()) }",
    "$ ls -la | grep '\\.txt$' && echo \"done\" >> /tmp/log 2>&1",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "   return self.__dict__['_cache'][key]   \n",
    "/* block\n * comment\n */\nstatic inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
]

CJK = [
    "你好世界", "我爱北京天安门。", "今天天气很好，我们去公园散步吧！", "人工智能正在改变世界。",
    "日本語のテキストです。ひらがなとカタカナと漢字。", "東京は日本の首都です。", "カタカナ　ひらがな　漢字",
    "안녕하세요, 세계! 한국어 텍스트입니다.", "대한민국의 수도는 서울입니다.", "中文English混合text测试123",
    "々〆〇ヶ〻", "「引用」『二重』（括弧）【見出し】", "𠀀𠀁𪚥𰻞𰻞麵", "⼀⼁⼂ ⺀⺁", "abc你好def", "ABC漢字xyz",
    "Ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３", "ｶﾀｶﾅ ﾊﾝｶｸ", "中。文，标点；符号：测试？", "𖿰𖿱 mark",
]

EMOJI = [
    "👋🏻👋🏼👋🏽👋🏾👋🏿", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 🏴‍☠️", "🇯🇵🇺🇸🇩🇪", "1️⃣2️⃣#️⃣", "❤️‍🔥 love",
    "Hello 😀😃😄 world", "🧑🏽‍💻 coding", "emoji🙂inside🙃words", "👩🏿‍🦰👨🏻‍🦳", "☺️✌️☝🏽", "🫠🫡🫥🪿🫎",
]

RTL = [
    "مرحبا بالعالم", "السلام عليكم ورحمة الله", "שלום עולם", "עברית עם ניקוד: בְּרֵאשִׁית",
    "العربية ١٢٣٤٥٦٧٨٩٠ أرقام", "mixed English עברית and العربية", "فارسی ۱۲۳۴", "اللُّغَةُ العَرَبِيَّةُ",
]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE",
                "'M", "'LL", "'Ll", "'D", "'ſ", "’s", "'x", "''", "'"]
WORDS = ["it", "IT", "It", "don", "DON", "we", "WE", "they", "THEY", "I", "you", "YOU", "she", "a",
         "Élan", "naïve", "ÉCOLE", "straße", "ǅemal", "ǈ", "Ωmega", "ωmega", "Ḁ", "x"]
PUNCT = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "–", "«", "»", "¿", "¡", "§", "¶", "†",
                                                      "•", "·", "‰", "′", "″", "‹", "›", "。", "、", "！"]
WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2028", "\u2029",
      "\u180e", "\x0b", "\x0c", "\x85", "\u2003", "\u200b", "\u202f", "\ufeff"]
SPECIAL_STRS = ["[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "[EOT]",
                "[start_header_id]", "[end_header_id]", "[UNK]", "[PAD]", "<|reserved_token_163592|>",
                "<|im_end|>", "<|endoftext|>", "[BOS", "<|open", "<|sep|"]


def gen_texts(rng):
    t = []
    t += corpus_texts(rng, 130)
    t += CODE
    for _ in range(15):  # code-ish mutations
        a, b = rng.sample(CODE, 2)
        t.append(a[: rng.randrange(len(a))] + b[rng.randrange(len(b)):])
    t += CJK
    for _ in range(25):
        parts = [rand_range(rng, 0x4E00, 0x9FFF, rng.randint(1, 8)), rand_range(rng, 0x3041, 0x3096, rng.randint(1, 6)),
                 rand_range(rng, 0x30A1, 0x30FA, rng.randint(1, 6)), rand_range(rng, 0xAC00, 0xD7A3, rng.randint(1, 6)),
                 rng.choice(["", " ", "、", "。", "ー", "abc", "Q", "12", "々"])]
        rng.shuffle(parts)
        t.append("".join(parts))
    t += EMOJI
    for _ in range(15):
        t.append(" ".join(rng.choice(EMOJI) + rng.choice(["", " ", "x", "A"]) for _ in range(rng.randint(1, 4))))
    t += RTL
    for _ in range(10):
        t.append(rand_range(rng, 0x0621, 0x064A, rng.randint(2, 8)) + " " + rand_range(rng, 0x05D0, 0x05EA, rng.randint(2, 8)))
    for _ in range(25):  # combining marks, incl. marks with no base and marks after Han
        s = ""
        for _ in range(rng.randint(1, 8)):
            s += rng.choice(["a", "E", "o", "ſ", "", " ", "漢", "1", "-", "क", "ก", "Ж"])
            s += rand_range(rng, 0x0300, 0x036F, rng.randint(0, 3))
            s += rng.choice(["", "\u093f", "\u0e31", "\u20dd", "\u0489", "\U00016ff0"])
        t.append(s)
    for _ in range(45):  # whitespace runs
        t.append("".join(rng.choice(WS + ["word", "X", "1", "!", "é", "中"]) for _ in range(rng.randint(1, 14))))
    t += [" ", "   ", "\n", "\r\n\r\n", "a  ", "a \n", "a\t\t", "  a", "\n\n\nb", " \u00a0 x", "x\u3000\u3000y", "trailing   "]
    for n in list(range(1, 26)) + [31, 40, 64]:  # digits of all lengths
        t.append("".join(rng.choice("0123456789") for _ in range(n)))
    for _ in range(15):
        t.append(rng.choice(["v", "x=", "$", "", " ", "A"]) + str(rng.randrange(10 ** rng.randint(1, 20))) +
                 rng.choice(["", ".", ".5", "e10", "%", "th", "k", "²", "٣٤٥", "Ⅻ", "①②", "１２３４", "ⅷ"]) +
                 rng.choice(["", " 0", "\n7"]))
    for _ in range(40):  # contractions
        s = ""
        for _ in range(rng.randint(1, 5)):
            s += rng.choice(["", " "]) + rng.choice(WORDS) + rng.choice(CONTRACTIONS) + rng.choice(["", "s", "x", "'", " "])
        t.append(s)
    for _ in range(25):  # punctuation runs
        t.append("".join(rng.choice(PUNCT + [" ", "\n", "a", "1"]) for _ in range(rng.randint(1, 20))))
    for _ in range(60):  # random scalar values from many planes
        t.append("".join(rand_scalar(rng, [0, 0, 0, 1, 2, 3, 14, 15, 16]) for _ in range(rng.randint(1, 25))))
    for _ in range(25):  # special-token text (plain text for encode_ordinary)
        s = ""
        for _ in range(rng.randint(1, 5)):
            s += rng.choice(SPECIAL_STRS) + rng.choice(["", " ", "hi", "\n", "你好", "[", "<|"])
        t.append(s)
    return t


def ids_checksum(ids):
    """FNV-1a-style 64-bit fold of the ids (mirrored in test_tokenizer_goldens.cpp)."""
    h = 1469598103934665603
    for i in ids:
        h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def corpus_checksums(enc):
    """Whole-corpus encodings, too big to store, as (token count, checksum) per file."""
    out = {}
    for f in sorted((SHARED / "corpora").glob("*.txt")):
        ids = enc.encode_ordinary(f.read_text(encoding="utf-8"))
        out[f.name] = [len(ids), str(ids_checksum(ids))]
    return out


def unicode14_assigned(c):
    return unicodedata.category(c) != "Cn"  # this Python's unicodedata is what PCRE2 10.42 uses


def class_ranges(enc_for, pat):
    """Code points matched by the one-character regex `pat` under tiktoken's regex engine.
    tiktoken skips text the regex does not match, so decode(encode(all chars)) keeps exactly
    the members."""
    enc = enc_for(pat)
    chars = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    members = sorted(set(map(ord, enc.decode(enc.encode_ordinary(chars)))))
    ranges = []
    for c in members:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ranges


def main():
    rng = random.Random(20250101)
    kimi_ranks = load_ranks(SHARED / "tokenizers" / "kimi" / "tiktoken.model")
    specials = kimi_specials(len(kimi_ranks))
    kimi = tiktoken.Encoding(name="kimi", pat_str=KIMI_PAT, mergeable_ranks=kimi_ranks, special_tokens=specials)
    assert kimi.encode_ordinary("Hello, world!") == [19180, 11, 2695, 0]
    assert kimi.encode_ordinary("你好世界") == [33845, 2243]
    assert kimi.encode_ordinary("1234567890") == [6694, 12972, 16242, 15]

    texts = gen_texts(rng)
    special_texts = [x for x in texts if any(s in x for s in SPECIAL_STRS)] + [
        "[BOS]hello<|end_of_msg|>", "<|open|>think<|sep|>hi<|close|>think<|sep|>", "x[EOS][EOS]y",
        "<|reserved_token_163592|> <|reserved_token_163837|>", "[BOS[BOS]]", "<|open|<|open|>|>"]
    lossy = []
    for _ in range(120):
        n = rng.randint(1, 12)
        b = bytes(rng.choice([rng.randrange(256), rng.choice([0x80, 0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]),
                              0x41, 0xA0, 0x90, 0x8F]) for _ in range(n))
        lossy.append([b.hex(), b.decode("utf-8", "replace")])
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "kimi_goldens.json", "w") as f:
        json.dump({"texts": texts, "ids": [kimi.encode_ordinary(x) for x in texts],
                   "special_texts": special_texts,
                   "special_ids": [kimi.encode(x, allowed_special="all") for x in special_texts],
                   "lossy": lossy, "corpora": corpus_checksums(kimi)}, f, ensure_ascii=True, separators=(",", ":"))

    cl_ranks = load_ranks(SHARED / "tokenizers" / "openai" / "cl100k_base.tiktoken")
    cl = tiktoken.Encoding(name="cl", pat_str=CL100K_PAT, mergeable_ranks=cl_ranks, special_tokens={})
    cl_texts = texts[::2] + ["a \n", "x  ", "end\n", "  \n  ", "it's IT'S"]
    with open(OUT / "cl100k_goldens.json", "w") as f:
        json.dump({"texts": cl_texts, "ids": [cl.encode_ordinary(x) for x in cl_texts]}, f,
                  ensure_ascii=True, separators=(",", ":"))

    def enc_for(pat):
        return tiktoken.Encoding(name="probe", pat_str=pat, mergeable_ranks=kimi_ranks, special_tokens={})
    atoms = {
        "han": r"[\p{Han}]",
        "upper_not_han": r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
        "lower_not_han": r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
        "letter": r"\p{L}", "number": r"\p{N}", "space": r"\s",
        # Assigned in tiktoken's Unicode but not in Unicode 14 (PCRE2 10.42's tables).
        "assigned": r"\P{Cn}",
    }
    classes = {name: class_ranges(enc_for, pat) for name, pat in atoms.items()}
    newer = [c for a, b in classes["assigned"] for c in range(a, b + 1) if not unicode14_assigned(chr(c))]
    classes["assigned_after_unicode14"] = []
    for c in newer:
        r = classes["assigned_after_unicode14"]
        if r and r[-1][1] == c - 1:
            r[-1][1] = c
        else:
            r.append([c, c])
    with open(OUT / "kimi_classes.json", "w") as f:
        json.dump(classes, f, separators=(",", ":"))
    print(len(texts), "texts;", len(special_texts), "special texts;", len(cl_texts), "cl100k texts;",
          len(newer), "code points assigned after Unicode 14")


if __name__ == "__main__":
    main()
