"""Write tests/data/tokenizer/k3tiny_goldens.json: tiktoken ids of fixed texts for models/k3-tiny,
checked by tests/unit/test_k3tiny_tokenizer.cpp. Regenerate after retraining the vocab."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from k3tiny.common import make_encoding  # noqa: E402

ORDINARY = [
    "Hello, world!",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition,",
    "In the beginning God created the heaven and the earth.",
    "Ge1:1 In the beginning God created the heaven and the earth.\nGe1:2 And the earth was without form, and void;",
    "\"I'm sure you're right,\" she said; \"they'll come, won't they? It's Mr. Darcy's.\"",
    "THE END\n\n\nFINIS",
    "CHAPTER XLII\n\n",
    "1234567890 3.14159 2024-05-09 1,000,000",
    "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "import os\nimport sys\n\nfrom collections import defaultdict, OrderedDict\n",
    "class Foo(Base):\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n        self._cache = {}\n",
    "if __name__ == '__main__':\n    sys.exit(main())\n",
    "    raise ValueError(f\"invalid literal for int() with base {base}: {s!r}\")\n",
    "x = [i ** 2 for i in range(10) if i % 2 == 0]  # squares of evens\n",
    "\t\ttabs\tand  spaces   \n\n\n",
    "   leading and trailing   ",
    "\r\nwindows\r\nline endings\r\n",
    "# -*- coding: utf-8 -*-\n#!/usr/bin/env python3\n",
    "@dataclass(frozen=True)\nclass Point:\n    x: float = 0.0\n    y: float = 0.0\n",
    "naïve café résumé — “curly quotes” and ‘single’ …",
    "你好世界",
    "Привет, мир! Ωμέγα. مرحبا ١٢٣",
    "emoji 😀👍🏽 mixed with text",
    "ǅemal ǈubljana ÀÉÎÕÜ",
    "'S 'T 'RE 'VE 'M 'LL 'D's I'M WE'LL",
    "[BOS]<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>",
    "<|reserved_token_8000|> [PAD] [UNK]",
    "",
    " ",
    "a",
    "\n",
    "{'key': [1, 2, 3], \"other\": None, 'flag': True}",
    "https://www.python.org/dev/peps/pep-0008/#naming-conventions",
    "0x7fffffff 0o777 0b1010 1e-10 1_000_000",
]

SPECIAL = [
    "[BOS]Hello[EOS]",
    "<|open|>message role=\"user\"<|sep|>Continue the story: It was a dark night.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|>",
    "text [PAD][PAD] more <|reserved_token_8000|> [UNK] [start_header_id]user[end_header_id] [EOT]",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="models/k3-tiny")
    ap.add_argument("--out", default="tests/data/tokenizer/k3tiny_goldens.json")
    args = ap.parse_args()
    enc = make_encoding(args.model)
    g = {"model": "models/k3-tiny", "generator": "python/k3tiny/gen_goldens.py (tiktoken)",
         "texts": ORDINARY, "ids": [enc.encode_ordinary(t) for t in ORDINARY],
         "special_texts": SPECIAL, "special_ids": [enc.encode(t, allowed_special="all") for t in SPECIAL]}
    with open(args.out, "w", encoding="utf-8") as f:  # one text / id list per line
        f.write("{\n" + ",\n".join(
            f"{json.dumps(k)}: " + (json.dumps(v, ensure_ascii=False) if not isinstance(v, list) else
                                    "[\n  " + ",\n  ".join(json.dumps(x, ensure_ascii=False) for x in v) + "\n]")
            for k, v in g.items()) + "\n}\n")
    print(f"[goldens] {len(ORDINARY)} ordinary + {len(SPECIAL)} special texts -> {args.out}")


if __name__ == "__main__":
    main()
