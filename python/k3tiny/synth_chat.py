"""Synthetic K3 chat examples for k3-tiny: reasoning, tool calls, plain answers.

Every example is an OpenAI-style request (messages, optional tools, thinking / thinking_effort) that
is rendered with the real Kimi-K3.jinja template (jinja2) and cut into [is_special, text] segments at
the XTML control markers, so the training text is exactly what k3.cpp's server renders.

Kinds (names `chat/synth/<kind>/<n>`, split by the usual hash rule):
  reason  ~1300  a simple checkable question (arithmetic, comparison, letter counting, alphabetical
                 order, uppercase, reverse, unit conversion); thinking on: reasoning_content (1-3
                 sentences) + the answer sentence
  tool    ~1100  1-3 tools declared (get_weather, calculator, search_books, get_time); the assistant
                 thinks briefly and calls one tool (JSON arguments) and the message ends there; half
                 continue with a tool result and a final answer; ~15% declare tools but ask a question
                 that needs none (answered directly); thinking on for ~85%
  plain   ~800   the reason tasks with thinking off (no think block)

`python3 python/k3tiny/synth_chat.py --prompts tests/data/chat/k3tiny_chat_prompts.json` writes six
val requests (2 reason, 2 tool, 2 plain) with their expected answers for the server's e2e tests.
"""
import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from k3tiny.common import shared_dir, split_of  # noqa: E402

MARKER_RE = re.compile(r"(<\|open\|>|<\|close\|>|<\|sep\|>|<\|end_of_msg\|>)")

TOOLS = {
    "get_weather": {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    "calculator": {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
            "required": ["expression"]}}},
    "search_books": {"type": "function", "function": {
        "name": "search_books", "description": "Search the library for books and passages.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "description": "Maximum number of results"}},
            "required": ["query"]}}},
    "get_time": {"type": "function", "function": {
        "name": "get_time", "description": "Get the current local time in a timezone.",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "description": "IANA timezone, e.g. Europe/London"}},
            "required": ["timezone"]}}},
}

CITIES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Lisbon", "Dublin", "Oslo",
          "Stockholm", "Helsinki", "Warsaw", "Athens", "Cairo", "Nairobi", "Lagos", "Tokyo", "Osaka",
          "Seoul", "Beijing", "Shanghai", "Mumbai", "Delhi", "Bangkok", "Singapore", "Sydney",
          "Melbourne", "Auckland", "Toronto", "Montreal", "Chicago", "Boston", "Denver", "Seattle",
          "New York", "San Francisco", "Mexico City", "Lima", "Santiago", "Buenos Aires", "Bath",
          "Brighton", "Edinburgh", "Manchester", "Oxford", "Zurich", "Amsterdam", "Brussels", "Copenhagen"]
TIMEZONES = {"London": "Europe/London", "Paris": "Europe/Paris", "Berlin": "Europe/Berlin",
             "Madrid": "Europe/Madrid", "Rome": "Europe/Rome", "Athens": "Europe/Athens",
             "Moscow": "Europe/Moscow", "Cairo": "Africa/Cairo", "Nairobi": "Africa/Nairobi",
             "Tokyo": "Asia/Tokyo", "Seoul": "Asia/Seoul", "Shanghai": "Asia/Shanghai",
             "Kolkata": "Asia/Kolkata", "Singapore": "Asia/Singapore", "Dubai": "Asia/Dubai",
             "Sydney": "Australia/Sydney", "Auckland": "Pacific/Auckland", "New York": "America/New_York",
             "Chicago": "America/Chicago", "Denver": "America/Denver", "Los Angeles": "America/Los_Angeles",
             "Toronto": "America/Toronto", "Mexico City": "America/Mexico_City", "Lima": "America/Lima",
             "Sao Paulo": "America/Sao_Paulo", "Honolulu": "Pacific/Honolulu"}
BOOK_QUERIES = [
    ("Elizabeth Bennet", "Pride and Prejudice", "Jane Austen"), ("Mr. Darcy", "Pride and Prejudice", "Jane Austen"),
    ("Netherfield", "Pride and Prejudice", "Jane Austen"), ("Emma Woodhouse", "Emma", "Jane Austen"),
    ("Mr. Knightley", "Emma", "Jane Austen"), ("Highbury", "Emma", "Jane Austen"),
    ("Fanny Price", "Mansfield Park", "Jane Austen"), ("Mansfield Park", "Mansfield Park", "Jane Austen"),
    ("Catherine Morland", "Northanger Abbey", "Jane Austen"), ("Northanger Abbey", "Northanger Abbey", "Jane Austen"),
    ("Anne Elliot", "Persuasion", "Jane Austen"), ("Captain Wentworth", "Persuasion", "Jane Austen"),
    ("Elinor Dashwood", "Sense and Sensibility", "Jane Austen"), ("Marianne Dashwood", "Sense and Sensibility", "Jane Austen"),
    ("Willoughby", "Sense and Sensibility", "Jane Austen"), ("Bath", "Persuasion", "Jane Austen"),
    ("In the beginning", "Genesis (King James Bible)", "King James Bible"), ("Noah and the ark", "Genesis (King James Bible)", "King James Bible"),
    ("the book of Ruth", "Ruth (King James Bible)", "King James Bible"), ("Psalm 23", "Psalms (King James Bible)", "King James Bible"),
    ("the Sermon on the Mount", "Matthew (King James Bible)", "King James Bible"), ("Jonah", "Jonah (King James Bible)", "King James Bible"),
    ("David and Goliath", "1 Samuel (King James Bible)", "King James Bible"), ("the prodigal son", "Luke (King James Bible)", "King James Bible"),
    ("Proverbs about wisdom", "Proverbs (King James Bible)", "King James Bible"), ("Moses", "Exodus (King James Bible)", "King James Bible"),
]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "partly cloudy", "clear"]
EFFORTS = ["max"] * 7 + ["high"] * 2 + ["low"]
NUM_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def book_words(corp_dir):
    """Lowercase alphabetic words (3-9 letters) that occur in the books, sorted."""
    words = set()
    for fn in sorted(os.listdir(corp_dir)):
        if fn.endswith(".txt"):
            with open(os.path.join(corp_dir, fn), encoding="utf-8", errors="replace") as f:
                words.update(re.findall(r"\b[a-z]{3,9}\b", f.read()))
    return sorted(words)


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


# ---- simple checkable tasks: (question, reasoning, answer) ---------------------------------------

def task_arith(r, words):
    op = r.choice("+-*")
    if op == "+":
        a, b = r.randint(1, 99), r.randint(1, 99)
        c, name = a + b, "sum"
    elif op == "-":
        a, b = sorted((r.randint(1, 99), r.randint(1, 99)), reverse=True)
        c, name = a - b, "difference"
    else:
        a, b = r.randint(2, 12), r.randint(2, 12)
        c, name = a * b, "product"
    sym = {"+": "+", "-": "-", "*": "*"}[op]
    q = r.choice([f"What is {a} {sym} {b}?", f"Compute {a} {sym} {b}.", f"What's {a} {sym} {b}?",
                  f"Calculate {a} {sym} {b}.", f"{a} {sym} {b} = ?"])
    if op == "+":
        if a >= 10 and b >= 10:
            t = f"{a} + {b}: {a} + {b // 10 * 10} = {a + b // 10 * 10}, then + {b % 10} = {c}."
        else:
            t = f"Adding {b} to {a} gives {c}."
    elif op == "-":
        t = f"Subtracting {b} from {a} leaves {c}."
    else:
        t = f"{a} times {b} is {c}."
    t += r.choice(["", f" So the {name} is {c}."])
    ans = r.choice([f"{a} {sym} {b} = {c}.", f"The answer is {c}.", f"The {name} is {c}."])
    return q, t, ans


def task_compare(r, words):
    a, b = r.sample(range(1, 1000), 2)
    big = max(a, b)
    if r.random() < 0.5:
        q = r.choice([f"Which is larger, {a} or {b}?", f"Which number is bigger: {a} or {b}?",
                      f"Is {a} greater than {b}?"])
        if q.startswith("Is"):
            t = f"{a} and {b}: {big} is the larger one, so {a} is {'' if a > b else 'not '}greater than {b}."
            return q, t, (f"Yes, {a} is greater than {b}." if a > b else f"No, {a} is less than {b}.")
        return q, f"Comparing {a} and {b}, {big} is larger.", f"{big} is larger."
    small = min(a, b)
    q = r.choice([f"Which is smaller, {a} or {b}?", f"Which number is less: {a} or {b}?"])
    return q, f"Comparing {a} and {b}, {small} is smaller.", f"{small} is smaller."


def task_count(r, words):
    w = r.choice(words)
    if r.random() < 0.3:
        q = r.choice([f"How many letters are in the word '{w}'?", f"How long is the word \"{w}\" in letters?"])
        t = f"Spelling it out: {'-'.join(w)}. That is {len(w)} letters."
        return q, t, f"The word \"{w}\" has {len(w)} letters."
    ch = r.choice(w) if r.random() < 0.8 else r.choice("abcdefghijklmnopqrstuvwxyz")
    n = w.count(ch)
    q = r.choice([f"How many times does the letter '{ch}' appear in '{w}'?",
                  f"Count the letter {ch} in the word \"{w}\".",
                  f"How many {ch}'s are in \"{w}\"?"])
    pos = [str(i + 1) for i, c in enumerate(w) if c == ch]
    t = f"The letters of \"{w}\" are {'-'.join(w)}. "
    t += (f"'{ch}' is at position{'s' if n > 1 else ''} {', '.join(pos)}, so it appears {n} time{'s' if n != 1 else ''}."
          if n else f"There is no '{ch}' in it.")
    return q, t, f"The letter '{ch}' appears {n} time{'s' if n != 1 else ''} in \"{w}\"."


def task_alpha(r, words):
    a, b = r.sample(words, 2)
    first = min(a, b)
    q = r.choice([f"Which comes first alphabetically, '{a}' or '{b}'?",
                  f"Which word comes first in a dictionary: {a} or {b}?",
                  f"In alphabetical order, does \"{a}\" come before \"{b}\"?"])
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    if i < min(len(a), len(b)):
        t = f"Compare letter by letter: they differ at position {i + 1}, where '{a[i]}' vs '{b[i]}'; '{first[i]}' comes first."
    else:
        t = f"One word is a prefix of the other, so the shorter one, \"{first}\", comes first."
    if q.startswith("In"):
        return q, t, (f"Yes, \"{a}\" comes before \"{b}\"." if first == a else f"No, \"{b}\" comes before \"{a}\".")
    return q, t, f"\"{first}\" comes first alphabetically."


def task_upper(r, words):
    w = r.choice(words)
    q = r.choice([f"Write '{w}' in uppercase.", f"Convert \"{w}\" to capital letters.", f"Uppercase the word {w}."])
    return q, f"Each letter of \"{w}\" becomes its capital form.", f"{w.upper()}"


def task_reverse(r, words):
    w = r.choice([x for x in words if len(x) <= 7] or words)
    q = r.choice([f"Reverse the word '{w}'.", f"Spell \"{w}\" backwards.", f"What is '{w}' written backwards?"])
    return q, f"The letters are {'-'.join(w)}; read from the end they are {'-'.join(w[::-1])}.", f"\"{w}\" reversed is \"{w[::-1]}\"."


CONVERSIONS = [("kilometre", "metre", 1000), ("metre", "centimetre", 100), ("kilogram", "gram", 1000),
               ("hour", "minute", 60), ("minute", "second", 60), ("day", "hour", 24), ("foot", "inch", 12),
               ("week", "day", 7), ("litre", "millilitre", 1000), ("yard", "foot", 3), ("dozen", "egg", 12)]
PLURALS = {"foot": "feet", "inch": "inches"}


def unit(n, u):
    return f"{n} {u if n == 1 else PLURALS.get(u, u + 's')}"


def task_convert(r, words):
    a, b, f = r.choice(CONVERSIONS)
    n = r.randint(1, 12)
    if a == "dozen":
        q = r.choice([f"How many eggs are in {n} dozen?", f"{n} dozen eggs is how many eggs?"])
        return q, f"A dozen is 12, so {n} x 12 = {n * 12}.", f"{n} dozen is {n * 12} eggs."
    bs = PLURALS.get(b, b + "s")
    q = r.choice([f"How many {bs} are in {unit(n, a)}?", f"Convert {unit(n, a)} to {bs}.",
                  f"{unit(n, a)} is how many {bs}?"])
    t = f"There are {f} {bs} in one {a}, so {n} x {f} = {n * f}."
    return q, t, f"{unit(n, a)} is {unit(n * f, b)}."


TASKS = [task_arith, task_arith, task_compare, task_count, task_alpha, task_upper, task_reverse, task_convert]


# ---- tool conversations ---------------------------------------------------------------------------

def tool_case(r):
    """(tool name, user question, reasoning, arguments dict, result dict, final answer)."""
    kind = r.choice(["get_weather", "get_weather", "calculator", "search_books", "get_time"])
    if kind == "get_weather":
        city = r.choice(CITIES)
        unit_ = r.choice([None, None, "celsius", "fahrenheit"])
        temp = r.randint(-5, 32) if unit_ != "fahrenheit" else r.randint(23, 90)
        cond = r.choice(CONDITIONS)
        q = r.choice([f"What's the weather like in {city}?", f"Is it raining in {city} right now?",
                      f"How warm is it in {city} today?", f"What is the weather in {city}?",
                      f"Tell me the current weather in {city}."])
        if unit_:
            q = q + f" Give the temperature in {unit_}."
        args = {"city": city} if not unit_ else {"city": city, "unit": unit_}
        u = unit_ or "celsius"
        res = {"city": city, "temperature": temp, "unit": u, "condition": cond}
        th = f"The user wants the current weather in {city}. I should call get_weather with city \"{city}\"" + \
             (f" and unit {unit_}." if unit_ else ".")
        deg = "C" if u == "celsius" else "F"
        ans = r.choice([f"It is currently {temp} degrees {u.capitalize()} and {cond} in {city}.",
                        f"In {city} it is {cond}, {temp}°{deg}."])
        return kind, q, th, args, res, ans
    if kind == "calculator":
        a, b = r.randint(100, 9999), r.randint(11, 999)
        op = r.choice(["*", "+", "-", "*"])
        expr = f"{a} {op} {b}"
        if r.random() < 0.25:
            c = r.randint(2, 99)
            expr = f"({a} {op} {b}) * {c}"
        val = eval(expr)  # noqa: S307 -- our own digits and operators
        q = r.choice([f"What is {expr}?", f"Can you calculate {expr} for me?", f"Use the calculator: {expr}",
                      f"Please compute {expr}."])
        th = f"This needs exact arithmetic on larger numbers, so I will use the calculator with \"{expr}\"."
        return kind, q, th, {"expression": expr}, {"result": val}, r.choice([f"{expr} = {val}.", f"The result is {val}."])
    if kind == "search_books":
        query, title, author = r.choice(BOOK_QUERIES)
        limit = r.choice([None, None, 1, 3, 5])
        q = r.choice([f"Find books about {query}.", f"Search the library for {query}.",
                      f"Which book mentions {query}?", f"Look up {query} in the library."])
        if limit:
            q = q[:-1] + f", at most {plural(limit, 'result')}."
        args = {"query": query} if not limit else {"query": query, "limit": limit}
        res = {"results": [{"title": title, "author": author}]}
        th = f"The user is asking about {query}. I will search the library with search_books."
        ans = r.choice([f"{query} appears in {title}" + ("." if author in title else f" by {author}."),
                        f"I found one result: {title}."])
        return kind, q, th, args, res, ans
    place = r.choice(sorted(TIMEZONES))
    tz = TIMEZONES[place]
    hh, mm = r.randint(0, 23), r.randint(0, 59)
    q = r.choice([f"What time is it in {place}?", f"What's the current time in {place}?",
                  f"Tell me the local time in {place}."])
    th = f"{place} is in the {tz} timezone, so I will call get_time with that timezone."
    return kind, q, th, {"timezone": tz}, {"timezone": tz, "time": f"{hh:02d}:{mm:02d}"}, \
        r.choice([f"It is {hh:02d}:{mm:02d} in {place}.", f"The local time in {place} is {hh:02d}:{mm:02d}."])


def declared_tools(r, needed):
    names = [n for n in TOOLS if n != needed]
    r.shuffle(names)
    k = r.choice([0, 0, 1, 1, 2])  # few tools: the declarations dominate the token count
    chosen = names[:k] + ([needed] if needed else [])
    if not chosen:
        chosen = names[:1]
    r.shuffle(chosen)
    return [TOOLS[n] for n in chosen]


def examples(words, seed, n_reason=1300, n_tool=1100, n_plain=800):
    """List of dicts: name, kind, request (messages, tools?, thinking, thinking_effort), expected."""
    r = random.Random(seed)
    out = []

    def add(kind, i, messages, tools=None, thinking=True, expected=None):
        req = {"messages": messages}
        if tools:
            req["tools"] = tools
        req["thinking"] = thinking
        if thinking:
            req["thinking_effort"] = r.choice(EFFORTS)
        out.append({"name": f"chat/synth/{kind}/{i:05d}", "kind": kind, "request": req, "expected": expected})

    for i in range(n_reason):
        q, t, a = r.choice(TASKS)(r, words)
        add("reason", i, [{"role": "user", "content": q},
                          {"role": "assistant", "reasoning_content": t, "content": a}])
    for i in range(n_tool):
        thinking = r.random() < 0.85
        if r.random() < 0.15:  # tools declared, but the question needs none
            q, t, a = r.choice(TASKS)(r, words)
            msg = {"role": "assistant", "content": a}
            if thinking:
                msg["reasoning_content"] = t + r.choice(["", " No tool is needed for this."])
            add("tool", i, [{"role": "user", "content": q}, msg], tools=declared_tools(r, None), thinking=thinking)
            continue
        name, q, th, args, res, ans = tool_case(r)
        call_id = f"call_{r.randrange(16 ** 8):08x}"
        call = {"role": "assistant", "content": "",
                "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)}}]}
        if thinking:
            call["reasoning_content"] = th
        msgs = [{"role": "user", "content": q}, call]
        if r.random() < 0.5:
            final = {"role": "assistant", "content": ans}
            if thinking:
                final["reasoning_content"] = r.choice([f"The tool returned {json.dumps(res)}. I can answer now.",
                                                       f"{name} answered; I will report the result."])
            msgs += [{"role": "tool", "tool_call_id": call_id, "content": json.dumps(res)}, final]
        add("tool", i, msgs, tools=declared_tools(r, name), thinking=thinking)
    for i in range(n_plain):
        q, t, a = r.choice(TASKS)(r, words)
        add("plain", i, [{"role": "user", "content": q}, {"role": "assistant", "content": a}], thinking=False)
    return out


def load_template(path):
    import jinja2
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    env.globals["raise_exception"] = raise_exception

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.filters["tojson"] = tojson  # as transformers' chat-template environment (takes ensure_ascii)
    with open(path, encoding="utf-8") as f:
        return env.from_string(f.read())


def render(tpl, req, add_generation_prompt=False):
    kw = {k: v for k, v in req.items() if k in ("tools", "thinking", "thinking_effort")}
    return tpl.render(messages=req["messages"], add_generation_prompt=add_generation_prompt, **kw)


def segments(text):
    segs = []
    for part in MARKER_RE.split(text):
        if not part:
            continue
        segs.append([bool(MARKER_RE.fullmatch(part)), part])
    return segs


def synth_records(shared, seed, **counts):
    """(split, record) for the corpus: source 'chat', segments of the jinja rendering."""
    tpl = load_template(os.path.join(shared, "data", "chat-templates", "Kimi-K3.jinja"))
    words = book_words(os.path.join(shared, "data", "corpora"))
    out = []
    for ex in examples(words, seed, **counts):
        text = render(tpl, ex["request"])
        out.append((split_of("chat", ex["name"]), {"source": "chat", "name": ex["name"], "segments": segments(text)}))
    return out


def prompts(shared, seed, path):
    """Six val requests (2 reason, 2 tool-call, 2 plain), without the final assistant turn."""
    words = book_words(os.path.join(shared, "data", "corpora"))
    picked = {"reason": [], "tool": [], "plain": []}
    for ex in examples(words, seed):
        if split_of("chat", ex["name"]) != "val" or len(picked[ex["kind"]]) >= 2:
            continue
        msgs = ex["request"]["messages"]
        if ex["kind"] == "tool" and not msgs[1].get("tool_calls"):
            continue
        if ex["kind"] == "tool" and len(picked["tool"]) == 1 and len(msgs) == 2:
            continue  # second tool example: the one with a tool result, so the final answer is tested too
        if ex["kind"] == "tool" and len(msgs) == 4:
            prompt_msgs, target = msgs[:3], msgs[3]
            # the call turn travels as OpenAI history: arguments string, reasoning dropped
        else:
            prompt_msgs, target = msgs[:1], msgs[1]
        req = {"name": ex["name"], "kind": ex["kind"], "messages": prompt_msgs}
        if "tools" in ex["request"]:
            req["tools"] = ex["request"]["tools"]
        req["chat_template_kwargs"] = {"thinking": ex["request"]["thinking"]}
        if ex["request"]["thinking"]:
            req["chat_template_kwargs"]["thinking_effort"] = ex["request"]["thinking_effort"]
        exp = {"content": target.get("content", "")}
        if target.get("reasoning_content"):
            exp["reasoning_content"] = target["reasoning_content"]
        if target.get("tool_calls"):
            exp["tool_calls"] = [{"name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"])}
                                 for tc in target["tool_calls"]]
        req["expected"] = exp
        picked[ex["kind"]].append(req)
    out = {"comment": "k3-tiny e2e chat prompts: val examples of python/k3tiny/synth_chat.py (seed %d); "
                      "'expected' is the assistant turn the model was shown in data of this distribution "
                      "(a trained tiny model need not reproduce it exactly)." % seed,
           "requests": picked["reason"] + picked["tool"] + picked["plain"]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=shared_dir())
    ap.add_argument("--seed", type=int, default=1235)
    ap.add_argument("--prompts", default="tests/data/chat/k3tiny_chat_prompts.json")
    ap.add_argument("--show", type=int, default=0, help="print N rendered examples of each kind")
    args = ap.parse_args()
    if args.show:
        tpl = load_template(os.path.join(args.shared, "data", "chat-templates", "Kimi-K3.jinja"))
        words = book_words(os.path.join(args.shared, "data", "corpora"))
        seen = {}
        for ex in examples(words, args.seed):
            if seen.get(ex["kind"], 0) < args.show:
                seen[ex["kind"]] = seen.get(ex["kind"], 0) + 1
                print(ex["name"], repr(render(tpl, ex["request"])), "\n")
        return
    out = prompts(args.shared, args.seed, args.prompts)
    print(f"[synth_chat] {len(out['requests'])} prompts -> {args.prompts}")


if __name__ == "__main__":
    main()
