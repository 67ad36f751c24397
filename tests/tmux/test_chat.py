"""`k3 chat` under tmux (a real terminal) and with stdin piped.

The reference reply comes from `k3 run` at temperature 0 on the chat prompt the server renders for the same
messages (`k3 serve`'s /tokenize with messages, then /detokenize), so the chat's template, streaming and
reasoning / answer split are checked against an independent path. Environment: K3_BIN, K3_SOURCE_DIR.
"""
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
import unittest

ROOT = os.environ.get("K3_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("K3_BIN", os.path.join(ROOT, "build", "release", "k3"))
MODEL = os.path.join(ROOT, "models", "k3-tiny")
MAX_TOKENS = 64
QUESTION = "How many inches are in 3 feet?"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    c.close()
    assert r.status == 200, data
    return data


def chat_prompt_text(messages):
    """The chat template applied to `messages` (generation prompt included), by `k3 serve`."""
    port = free_port()
    srv = subprocess.Popen([BIN, "serve", "-m", MODEL, "--port", str(port), "-t", "1", "--no-webui"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                ids = post(port, "/tokenize", {"messages": messages})["tokens"]
                break
            except OSError:
                if time.time() > deadline or srv.poll() is not None:
                    raise
                time.sleep(0.05)
        return post(port, "/detokenize", {"tokens": ids})["prompt"]
    finally:
        srv.terminate()
        srv.wait(30)


def reference_reply(messages):
    """(reasoning, answer) of `k3 run` at temperature 0 on the rendered chat prompt."""
    prompt = chat_prompt_text(messages)
    r = subprocess.run([BIN, "run", "-m", MODEL, "-p", "-", "--special", "--no-bos", "--temp", "0", "-n",
                        str(MAX_TOKENS), "-t", "1"], input=prompt.encode(), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = r.stdout.decode()
    assert text.startswith(prompt), text[:200]
    cont = text[len(prompt):]
    reasoning = cont.split("<|close|>think")[0]
    answer = cont.split("<|open|>response<|sep|>", 1)[1].split("<|close|>response")[0]
    return reasoning.strip(), answer.strip()


class Tmux:
    count = 0

    def __init__(self, tmp, command):
        Tmux.count += 1  # a server of its own each: a killed one may still hold its socket for a moment
        self.sock = os.path.join(tmp, f"tmux{Tmux.count}.sock")
        # The pane stays after the chat exits, showing its exit status.
        self.run("new-session", "-d", "-x", "160", "-y", "50", f"{command}; echo \"[exit $?]\"; sleep 600")

    def run(self, *args):
        return subprocess.run(["tmux", "-S", self.sock, "-f", "/dev/null", *args], check=True, capture_output=True,
                              timeout=30).stdout.decode()

    def keys(self, *keys, literal=False):
        self.run("send-keys", "-t", "0", *(["-l"] if literal else []), *keys)

    def type_line(self, text):
        self.keys(text, literal=True)
        self.keys("Enter")

    def screen(self, escapes=False):
        return self.run("capture-pane", "-p", "-J", "-S", "-200", "-t", "0", *(["-e"] if escapes else []))

    def wait_for(self, pred, what, timeout=60):
        deadline = time.time() + timeout
        while True:
            s = self.screen()
            if pred(s):
                return s
            if time.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{s}")
            time.sleep(0.05)

    def wait_prompt(self, n_prompts, timeout=60):
        """Waits for the n-th '> ' prompt to be the screen's last line (the chat waits for input)."""
        def ready(s):
            lines = [l for l in s.rstrip("\n").split("\n")]
            return sum(1 for l in lines if l.startswith(">")) >= n_prompts and lines[-1].rstrip() == ">"
        return self.wait_for(ready, f"prompt #{n_prompts}", timeout)

    def kill(self):
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True, timeout=30)


def reply_after(screen, question, nth=1):
    """The lines between the nth '> question' line and the next prompt."""
    lines = screen.rstrip("\n").split("\n")
    starts = [i for i, l in enumerate(lines) if l.rstrip() == "> " + question]
    if len(starts) < nth:  # not echoed yet
        return ""
    i = starts[nth - 1] + 1
    j = i
    while j < len(lines) and not lines[j].startswith(">"):
        j += 1
    return "\n".join(lines[i:j]).strip()


class ChatTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reasoning, cls.answer = reference_reply([{"role": "user", "content": QUESTION}])
        assert cls.answer, "the reference reply is empty"

    def test_tmux_session(self):
        with tempfile.TemporaryDirectory() as tmp:
            saved = os.path.join(tmp, "conv.json")
            t = Tmux(tmp, f"{BIN} chat -m {MODEL} --temp 0 -n {MAX_TOKENS} -t 1")
            try:
                t.wait_prompt(1)
                t.type_line(QUESTION)
                s = t.wait_prompt(2)
                want = self.reasoning + "\n" + self.answer
                self.assertEqual(reply_after(s, QUESTION), want, s)
                # The reasoning is dim (SGR 2), the answer not.
                esc = t.screen(escapes=True)
                self.assertIn("\x1b[2m" + self.reasoning.split("\n")[0][:20], esc)
                # /reset: the same question again gets the same reply (no history), and the saved
                # conversation holds only that exchange.
                t.type_line("/reset")
                t.wait_prompt(3)
                t.type_line(QUESTION)
                s = t.wait_prompt(4)
                self.assertEqual(reply_after(s, QUESTION, nth=2), want, s)
                t.type_line("/save " + saved)
                t.wait_prompt(5)
                with open(saved) as f:
                    conv = json.load(f)
                self.assertEqual([m["role"] for m in conv], ["user", "assistant"])
                self.assertEqual(conv[1]["content"], self.answer)
                # Ctrl-C stops a long reply (no end-of-turn stop, 3000 tokens) and the prompt comes back.
                t.type_line("/max 3000")
                t.wait_prompt(6)
                t.kill()
                t = Tmux(tmp, f"{BIN} chat -m {MODEL} --temp 0 -n 3000 --ignore-eos -t 1")
                t.wait_prompt(1)
                t.type_line("Tell me a long story.")
                t.wait_for(lambda s: len(reply_after(s, "Tell me a long story.")) > 300, "a long streamed reply")
                t0 = time.time()
                t.keys("C-c")
                s = t.wait_prompt(2, timeout=10)
                self.assertLess(time.time() - t0, 5)
                self.assertIn("[stopped]", s)
                # Still usable after the stop; then Ctrl-C at the prompt exits with status 0.
                t.type_line(QUESTION)
                t.wait_prompt(3)
                t.keys("C-c")
                s = t.wait_for(lambda s: "[exit " in s, "the chat to exit")
                self.assertIn("[exit 0]", s)
            finally:
                t.kill()

    def test_piped(self):
        """stdin not a terminal: no prompts or colours, stdout holds the replies alone; Ctrl-D (EOF) ends it."""
        with tempfile.TemporaryDirectory() as tmp:
            saved = os.path.join(tmp, "conv.json")
            script = f"{QUESTION}\n/reset\n{QUESTION}\nLine one \\\nline two\n/save {saved}\n/nope\n/temp -1\n"
            r = subprocess.run([BIN, "chat", "-m", MODEL, "--temp", "0", "-n", str(MAX_TOKENS), "-t", "1"],
                               input=script.encode(), capture_output=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = r.stdout.decode()
            one = f"(thinking) {self.reasoning}\n{self.answer}\n"
            self.assertTrue(out.startswith(one + one), out)
            self.assertNotIn("\x1b[", out)
            err = r.stderr.decode()
            self.assertIn("unknown command /nope", err)
            self.assertIn("/temp: expected", err)
            with open(saved) as f:
                conv = json.load(f)
            self.assertEqual([m["content"] for m in conv if m["role"] == "user"], [QUESTION, "Line one \nline two"])
            # The second turn (history through the template, its prefix from the chat's prefix cache) equals
            # k3 run on the whole rendered conversation.
            reasoning, answer = reference_reply(conv[:3])
            self.assertEqual((conv[3].get("reasoning_content", "").strip(), conv[3]["content"].strip()), (reasoning, answer))

    def test_input_not_utf8(self):
        """Bytes that are not UTF-8 (a Latin-1 terminal) become U+FFFD; they were an internal error (exit 3)."""
        with tempfile.TemporaryDirectory() as tmp:
            saved = os.path.join(tmp, "conv.json")
            r = subprocess.run([BIN, "chat", "-m", MODEL, "--temp", "0", "-n", "4", "-t", "1"],
                               input=b"caf\xe9 \xff\xfe ok\n/save " + saved.encode() + b"\n", capture_output=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(saved, encoding="utf-8") as f:
                self.assertEqual(json.load(f)[0]["content"], "caf\ufffd \ufffd\ufffd ok")

    def test_bad_flags(self):
        for args in (["--temp", "nan"], ["-n", "0"], ["--top-p", "2"], ["-c", "-5"]):
            r = subprocess.run([BIN, "chat", "-m", MODEL, *args], input=b"", capture_output=True, timeout=60)
            self.assertIn(r.returncode, (1, 2), (args, r.stderr))  # 2: a CLI usage error
            self.assertIn(b"error", r.stderr.lower(), args)


if __name__ == "__main__":
    unittest.main(verbosity=2)
