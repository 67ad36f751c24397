"""The web chat (`k3 serve`'s page at /) in headless Chromium, driven over the DevTools protocol (cdp.py).

One server (models/k3-tiny, --api-key) and one browser for the whole run, steps in order: the page asks for
the API key, shows the model name from /v1/models, streams an answer equal to the API's at temperature 0
(content and reasoning), keeps the conversation across a reload, stops a long reply with the Stop button,
and shows hostile model output (<img onerror>, <script>, in content, reasoning and tool calls) as text.
Environment: K3_BIN, K3_SOURCE_DIR, K3_CHROMIUM (the browser), K3_WEBCHAT_SCREENSHOT (where to write the
screenshot; default a temporary file).
"""
import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp import Browser  # noqa: E402

ROOT = os.environ.get("K3_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("K3_BIN", os.path.join(ROOT, "build", "release", "k3"))
CHROMIUM = os.environ.get("K3_CHROMIUM", "chromium")
KEY = "webchat-test-key"
MAX_TOKENS = 64
QUESTION = "How many inches are in 3 feet?"
HOSTILE = '<img src=x onerror="window.__xss=1">'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebChatTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.port = free_port()
        cls.server_log = open(os.path.join(cls.tmp.name, "server.log"), "w+")
        cls.server = subprocess.Popen([BIN, "serve", "-m", os.path.join(ROOT, "models", "k3-tiny"), "--port",
                                       str(cls.port), "--api-key", KEY, "-t", "1"],
                                      stdout=cls.server_log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            try:
                if cls.request("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or cls.server.poll() is not None:
                raise RuntimeError("the server did not start: " + cls.logs())
            time.sleep(0.05)
        try:
            cls.browser = Browser(CHROMIUM, os.path.join(cls.tmp.name, "profile"))
            cls.browser.open_page()
            cls.browser.navigate(f"http://127.0.0.1:{cls.port}/")
        except BaseException:
            cls.server.kill()
            cls.server.wait()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.browser.close()
        cls.server.terminate()
        cls.server.wait(30)
        cls.server_log.close()
        cls.tmp.cleanup()

    @classmethod
    def logs(cls):
        cls.server_log.seek(0)
        return cls.server_log.read()[-3000:]

    @classmethod
    def request(cls, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=60)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    # ---- helpers ------------------------------------------------------------------------------------
    def js(self, expr):
        return self.browser.eval(expr)

    def last_assistant(self):
        return self.js("""(() => { const all = document.querySelectorAll('#messages .msg.assistant');
            const m = all[all.length - 1]; if (!m) return null;
            const r = m.querySelector('.reasoning .reasoning-text'), d = m.querySelector('details.reasoning');
            const meta = m.querySelector('.meta');
            return {content: m.querySelector('.content').textContent, reasoning: r ? r.textContent : null,
                    open: d ? d.open : null, meta: meta ? meta.textContent : null, html: m.innerHTML}; })()""")

    def stored_messages(self):
        return self.js("""(() => { const cs = JSON.parse(localStorage.getItem('k3chat.conversations'));
            const cur = localStorage.getItem('k3chat.current');
            return cs.find(c => c.id === cur).messages; })()""")

    def send_message(self, text):
        self.browser.type_text("#input", text)
        self.browser.press_enter()
        self.browser.wait_for("document.body.dataset.busy === '1' || !!document.querySelector('#messages .meta')",
                              what="the request to start")

    def wait_idle(self, timeout=60):
        self.browser.wait_for("document.body.dataset.busy === '' && !document.querySelector('#send').disabled",
                              timeout=timeout, what="the reply to finish")

    def intercept(self, on_request):
        """Runs on_request(params) for the next chat request the page makes (Fetch domain)."""
        self.browser.send("Fetch.enable", {"patterns": [{"urlPattern": "*/v1/chat/completions", "requestStage": "Request"}]})
        return on_request

    # ---- the steps, in order --------------------------------------------------------------------------
    def test_1_api_key_and_model_name(self):
        self.browser.wait_for("document.querySelector('#model-name').textContent === '(API key needed)'",
                              what="the page to see the 401 of /v1/models")
        self.assertFalse(self.js("document.querySelector('#notice').hidden"))
        self.js("document.querySelector('#settings-toggle').click()")
        self.js(f"""(() => {{ const set = (id, v) => document.getElementById(id).value = v;
            set('api_key', {json.dumps(KEY)}); set('temperature', '0'); set('top_p', '1');
            set('max_tokens', '{MAX_TOKENS}'); document.getElementById('settings-save').click(); }})()""")
        self.browser.wait_for("document.querySelector('#model-name').textContent === 'k3-tiny'",
                              what="the model name from /v1/models")
        self.assertTrue(self.js("document.querySelector('#notice').hidden"))
        self.js("document.querySelector('#settings-toggle').click()")

    def test_2_streamed_answer_equals_api(self):
        self.send_message(QUESTION)
        self.wait_idle()
        got = self.last_assistant()
        status, body = self.request("POST", "/v1/chat/completions", {
            "model": "k3-tiny", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "top_p": 1,
            "max_tokens": MAX_TOKENS})
        self.assertEqual(status, 200, body)
        want = json.loads(body)["choices"][0]["message"]
        self.assertTrue(want.get("content"), want)
        # The raw text kept by the page is the API's exactly; the DOM shows it (Markdown rendering may drop
        # markers and blank lines, so compared without whitespace and '*' / '`').
        stored = self.stored_messages()
        self.assertEqual(stored[-1]["content"], want["content"])
        self.assertEqual(stored[-1]["reasoning"], want.get("reasoning_content", ""))
        strip = lambda s: "".join(ch for ch in s if not ch.isspace() and ch not in "*`")  # noqa: E731
        self.assertEqual(strip(got["content"]), strip(want["content"]))
        # Reasoning: its own collapsible block, closed once the answer is there, opened by a click.
        self.assertEqual(got["reasoning"], want["reasoning_content"])
        self.assertIs(got["open"], False)
        self.js("document.querySelector('#messages .msg.assistant details.reasoning summary').click()")
        self.assertTrue(self.js("document.querySelector('#messages .msg.assistant details.reasoning').open"))
        self.assertIn("finish: stop", got["meta"])
        shot = os.environ.get("K3_WEBCHAT_SCREENSHOT") or os.path.join(self.tmp.name, "webchat.png")
        self.browser.screenshot(shot)
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        print(f"screenshot: {shot}")
        self.__class__.first_answer = got

    def test_3_conversation_survives_reload(self):
        self.browser.reload()
        self.browser.wait_for("document.querySelector('#model-name').textContent === 'k3-tiny'",
                              what="the model name after the reload (API key kept)")
        titles = self.js("[...document.querySelectorAll('#conv-list .conv-title')].map(b => b.textContent)")
        self.assertEqual(titles, [QUESTION])
        got = self.last_assistant()
        self.assertEqual(got["content"], self.first_answer["content"])
        self.assertEqual(got["reasoning"], self.first_answer["reasoning"])
        self.assertEqual(self.js("document.querySelector('#messages .msg.user .content').textContent"), QUESTION)

    def test_4_stop_button(self):
        self.js("document.querySelector('#new-chat').click()")
        # The page's request goes to the server with ignore_eos and a long max_tokens, so the reply runs
        # until Stop (the tiny model would otherwise end it on its own within a few dozen tokens).
        self.browser.send("Fetch.enable", {"patterns": [{"urlPattern": "*/v1/chat/completions", "requestStage": "Request"}]})
        self.browser.type_text("#input", "Tell me a very long story.")
        self.browser.press_enter()
        paused = self.browser.wait_event("Fetch.requestPaused")
        body = json.loads(paused["request"]["postData"])
        self.assertEqual(body["messages"], [{"role": "user", "content": "Tell me a very long story."}])
        body.update(ignore_eos=True, max_tokens=3000)
        self.browser.send("Fetch.continueRequest", {"requestId": paused["requestId"],
                                                    "postData": base64.b64encode(json.dumps(body).encode()).decode()})
        self.browser.send("Fetch.disable")
        self.browser.wait_for("""(() => { const all = document.querySelectorAll('#messages .msg.assistant');
            const m = all[all.length - 1]; return m && m.textContent.length > 200; })()""", what="a streamed reply")
        self.assertFalse(self.js("document.querySelector('#stop').disabled"))
        self.js("document.querySelector('#stop').click()")
        self.wait_idle(timeout=10)
        got = self.last_assistant()
        self.assertIn("stopped by you", got["meta"])
        length = len(got["content"]) + len(got["reasoning"] or "")
        time.sleep(0.5)
        after = self.last_assistant()
        self.assertEqual(len(after["content"]) + len(after["reasoning"] or ""), length, "the reply grew after Stop")
        # The server saw the client go and cancelled the request (it would run 3000 tokens otherwise).
        deadline = time.time() + 3
        while True:
            metrics = self.request("GET", "/metrics")[1].decode()
            running = [l for l in metrics.splitlines() if l.startswith("k3_num_requests_running")]
            if running and float(running[0].split()[-1]) == 0:
                break
            self.assertLess(time.time(), deadline, f"the server still generates after Stop: {running}")
            time.sleep(0.05)

    def test_5_model_text_is_never_markup(self):
        self.js("document.querySelector('#new-chat').click()")
        self.browser.send("Fetch.enable", {"patterns": [{"urlPattern": "*/v1/chat/completions", "requestStage": "Request"}]})
        self.browser.type_text("#input", "say something nasty")
        self.browser.press_enter()
        paused = self.browser.wait_event("Fetch.requestPaused")

        def chunk(delta, finish=None):
            return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"
        sse = (chunk({"role": "assistant", "reasoning_content": "think " + HOSTILE})
               + chunk({"content": "Hi " + HOSTILE + " **bold** `<b>x</b>`\n\n```\n<script>window.__xss=3</script>\n```\n"})
               + chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {
                   "name": '<img src=x onerror="window.__xss=4">', "arguments": '{"a": "<svg onload=window.__xss=5>"}'}}]},
                   "tool_calls")
               + "data: [DONE]\n\n")
        self.browser.send("Fetch.fulfillRequest", {
            "requestId": paused["requestId"], "responseCode": 200,
            "responseHeaders": [{"name": "Content-Type", "value": "text/event-stream"}],
            "body": base64.b64encode(sse.encode()).decode()})
        self.browser.send("Fetch.disable")
        self.wait_idle(timeout=10)
        for _ in range(2):  # as streamed, then as stored and rendered again after a reload
            count = self.js("document.querySelectorAll('#messages img, #messages script, #messages svg, #messages b').length")
            self.assertEqual(count, 0, self.last_assistant()["html"])
            got = self.last_assistant()
            self.assertIn("Hi " + HOSTILE, got["content"])
            self.assertIn("<script>window.__xss=3</script>", got["content"])
            self.assertIn("<b>x</b>", got["content"])
            self.assertEqual(got["reasoning"], "think " + HOSTILE)
            self.assertEqual(self.js("document.querySelector('#messages .msg.assistant .tool-name').textContent"),
                             '<img src=x onerror="window.__xss=4">')
            self.assertIn("<svg onload=window.__xss=5>", self.js("document.querySelector('.tool-args').textContent"))
            self.assertEqual(self.js("document.querySelectorAll('#messages strong').length"), 1)  # Markdown still works
            self.assertIsNone(self.js("window.__xss === undefined ? null : window.__xss"))
            self.browser.reload()

    def test_6_delete_conversation(self):
        n = self.js("document.querySelectorAll('#conv-list li').length")
        self.assertEqual(n, 3)
        self.js("document.querySelector('#conv-list li.active .conv-delete').click()")
        self.assertEqual(self.js("document.querySelectorAll('#conv-list li').length"), 2)
        self.browser.reload()
        self.assertEqual(self.js("document.querySelectorAll('#conv-list li').length"), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
