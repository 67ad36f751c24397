"""End-to-end tests of `k3 serve` through the official openai client and raw HTTP.

ServerTest and ShutdownTest start the server on a free port with a temporary model directory: the
tiny random K3 checkpoint (tests/data/tiny-k3, vocab 1024) plus the 768-rank test tokenizer
(tests/data/tiny-tokenizer) -- fast, and its token ids are fixed. ChatTest serves the trained default
model models/k3-tiny (real XTML chat format): reasoning / content / tool-call structure and stream vs
non-stream equality. Assertions never depend on what exactly the model writes.
Environment: K3_BIN (the k3 binary), K3_SOURCE_DIR (the project root), K3_SERVE_ARGS (extra `k3 serve`
arguments for every server, e.g. "--device cuda" on a GPU machine: scripts/gpu-check), K3_SERVE_LAUNCHER (a
command the server runs under, e.g. "mpirun -np 2 --oversubscribe" with K3_SERVE_ARGS="--tp 2").
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import openai

from server_util import (MODEL, descendants, free_port, http_request, metric, mpi_rank0_below,  # noqa: F401
                         parse_metrics, read_log, wait_healthy)

ROOT = os.environ.get("K3_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("K3_BIN", os.path.join(ROOT, "build", "release", "k3"))
API_KEY = "test-key-123"
MAX_BODY = 100_000
K3_TINY = os.path.join(ROOT, "models", "k3-tiny")
MARKERS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<think>", "</think>", "message role=",
           "call tool=", "json type=", "argument key=")


def make_model_dir(tmp):
    d = os.path.join(tmp, "tiny-k3-tok")
    os.makedirs(d)
    for sub in ("tests/data/tiny-k3", "tests/data/tiny-tokenizer"):
        src = os.path.join(ROOT, sub)
        for f in os.listdir(src):
            os.symlink(os.path.join(src, f), os.path.join(d, f))
    return d


def sig_is_kill(sig):
    return sig == signal.SIGKILL


class ServerProcess:
    def __init__(self, extra=(), max_model_len=2048, model_dir=None):
        self.tmp = tempfile.TemporaryDirectory()
        self._sig = signal.SIGTERM
        self.model_dir = model_dir or make_model_dir(self.tmp.name)
        self.port = free_port()
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+")
        cmd = [*os.environ.get("K3_SERVE_LAUNCHER", "").split(), BIN, "serve", "-m", self.model_dir, "--port", str(self.port), "--api-key", API_KEY,
               "--served-model-name", MODEL, "--max-body-bytes", str(MAX_BODY), "--max-model-len", str(max_model_len),
               *extra, *os.environ.get("K3_SERVE_ARGS", "").split()]
        env = dict(os.environ, K3_NUM_THREADS=os.environ.get("K3_NUM_THREADS", "1"))
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited early:\n" + self.logs())
            try:
                st, _, _ = self.request("GET", "/health")
                if st == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("server did not become healthy:\n" + self.logs())
            time.sleep(0.05)
        self.ready_s = time.time() - self.t0

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            h = {"Authorization": "Bearer " + API_KEY}
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
                h["Content-Type"] = "application/json"
            h.update(headers or {})
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def client(self, key=API_KEY):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0, timeout=120)

    def server_pid(self):
        """The k3 serve process: ours, or under K3_SERVE_LAUNCHER (mpirun) its rank 0, which alone decides
        when the job ends (mpirun itself answers SIGTERM by ending the job with status 1)."""
        if not os.environ.get("K3_SERVE_LAUNCHER") or sig_is_kill(self._sig):
            return self.proc.pid
        return mpi_rank0_below(self.proc.pid)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self._sig = sig
            os.kill(self.server_pid(), sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def cleanup(self):
        self.log.close()
        self.tmp.cleanup()


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = ServerProcess()
        print(f"\n[e2e] server ready in {cls.srv.ready_s:.3f} s (process start to /health 200)", file=sys.stderr)
        cls.c = cls.srv.client()

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        logs = cls.srv.logs()
        cls.srv.cleanup()
        if rc != 0 or "ThreadSanitizer" in logs or "AddressSanitizer" in logs:
            print(logs, file=sys.stderr)
        assert rc == 0, f"server exit code {rc}"
        assert "ThreadSanitizer" not in logs, "TSan reported a problem"

    # ---- basics ------------------------------------------------------------------------------------
    def test_models(self):
        ms = self.c.models.list()
        self.assertEqual([m.id for m in ms.data], [MODEL])
        self.assertEqual(ms.data[0].object, "model")

    def test_health(self):
        st, _, _ = self.srv.request("GET", "/health", headers={"Authorization": ""})
        self.assertEqual(st, 200)

    def test_tokenize_detokenize_version(self):
        # vLLM's /tokenize ("prompt", BOS by default) and llama-server's ("content", no BOS by default, with_pieces);
        # /detokenize gives the text back under both projects' names; /version as vLLM's.
        st, _, body = self.srv.request("POST", "/tokenize", {"model": MODEL, "prompt": "Hello world"})
        self.assertEqual(st, 200, body)
        v = json.loads(body)
        self.assertEqual(v["count"], len(v["tokens"]))
        st, _, body = self.srv.request("POST", "/tokenize", {"content": "Hello world", "with_pieces": True})
        self.assertEqual(st, 200, body)
        pieces = json.loads(body)["tokens"]
        self.assertEqual(v["tokens"][1:], [p["id"] for p in pieces])  # the same text, BOS only in vLLM's form
        self.assertEqual("".join(p["piece"] for p in pieces), "Hello world")
        st, _, body = self.srv.request("POST", "/detokenize", {"tokens": v["tokens"][1:]})
        self.assertEqual(st, 200, body)
        d = json.loads(body)
        self.assertEqual((d["prompt"], d["content"]), ("Hello world", "Hello world"))
        chat = [{"role": "user", "content": "Say hi"}]
        st, _, body = self.srv.request("POST", "/tokenize", {"messages": chat})
        self.assertEqual(st, 200, body)
        r = self.c.chat.completions.create(model=MODEL, messages=chat, max_tokens=1)
        self.assertEqual(json.loads(body)["count"], r.usage.prompt_tokens)  # the prompt the chat endpoint runs
        for bad in ({"prompt": "a", "content": "b"}, {"prompt": 5}, {}, {"prompt": "a", "model": "other"}):
            st, _, body = self.srv.request("POST", "/tokenize", bad)
            self.assertIn(st, (400, 404), (bad, body))
        for bad in ({"tokens": [10 ** 30]}, {"tokens": "x"}, {"tokens": [-1]}, {"tokens": [1.5]}):
            st, _, body = self.srv.request("POST", "/detokenize", bad)
            self.assertEqual(st, 400, (bad, body))
        st, _, _ = self.srv.request("POST", "/tokenize", {"prompt": "a"}, headers={"Authorization": ""})
        self.assertEqual(st, 401)
        st, _, body = self.srv.request("GET", "/version")
        self.assertEqual(st, 200)
        self.assertRegex(json.loads(body)["version"], r"^\d+\.\d+\.\d+")

    def test_no_cors_by_default_and_preflight(self):
        # Without --allowed-origins no response carries CORS headers (browsers keep other sites' scripts
        # out); a preflight is answered 204 without them, an unknown path's 404.
        st, h, _ = self.srv.request("GET", "/version", headers={"Origin": "https://evil.example"})
        self.assertEqual(st, 200)
        self.assertNotIn("Access-Control-Allow-Origin", h)
        st, h, _ = self.srv.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://evil.example"})
        self.assertEqual(st, 204)
        self.assertNotIn("Access-Control-Allow-Origin", h)
        st, _, _ = self.srv.request("OPTIONS", "/nowhere")
        self.assertEqual(st, 404)

    def test_completion_length(self):
        r = self.c.completions.create(model=MODEL, prompt="Hello world", max_tokens=7, temperature=0,
                                      extra_body={"ignore_eos": True})
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 7)
        self.assertGreater(r.usage.prompt_tokens, 1)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 7)
        self.assertIsNone(r.usage.prompt_tokens_details)  # hidden without --enable-prompt-tokens-details
        self.assertIsInstance(r.choices[0].text, str)

    def test_completion_token_prompt(self):
        r = self.c.completions.create(model=MODEL, prompt=[768, 300, 301, 302], max_tokens=3, temperature=0,
                                      extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.prompt_tokens, 4)
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_greedy_deterministic(self):
        kw = dict(model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
        a = self.c.completions.create(**kw).choices[0].text
        b = self.c.completions.create(**kw).choices[0].text
        self.assertEqual(a, b)

    def test_seed(self):
        kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=1234,
                  extra_body={"ignore_eos": True})
        a = self.c.completions.create(**kw).choices[0].text
        b = self.c.completions.create(**kw).choices[0].text
        self.assertEqual(a, b)
        texts = {self.c.completions.create(**dict(kw, seed=s)).choices[0].text for s in range(1, 6)}
        self.assertGreater(len(texts), 1, "different seeds should give different samples")

    def test_completion_stream_matches(self):
        kw = dict(model=MODEL, prompt="Streaming test", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
        full = self.c.completions.create(**kw)
        chunks = list(self.c.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        self.assertEqual(text, full.choices[0].text)
        fins = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(fins, ["length"])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        self.assertTrue(all(ch.id == chunks[0].id for ch in chunks))

    def test_stop_string(self):
        kw = dict(model=MODEL, prompt="Stop strings", max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
        text = self.c.completions.create(**kw).choices[0].text
        self.assertGreater(len(text), 6)
        stop = text[3:5]
        expect = text[: text.find(stop)]
        r = self.c.completions.create(stop=[stop], **kw)
        self.assertEqual(r.choices[0].text, expect)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        streamed = "".join(ch.choices[0].text for ch in self.c.completions.create(stop=stop, stream=True, **kw))
        self.assertEqual(streamed, expect)

    def test_n2(self):
        r = self.c.completions.create(model=MODEL, prompt="Two choices", max_tokens=6, n=2, seed=7,
                                      extra_body={"ignore_eos": True})
        self.assertEqual(sorted(ch.index for ch in r.choices), [0, 1])
        self.assertEqual(r.usage.completion_tokens, 12)
        chunks = list(self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=5, n=2, seed=7, stream=True,
                                                     extra_body={"ignore_eos": True}))
        by = {}
        for ch in chunks:
            for c in ch.choices:
                by.setdefault(c.index, []).append(c)
        self.assertEqual(sorted(by), [0, 1])
        for cs in by.values():
            self.assertEqual(cs[0].delta.role, "assistant")
            self.assertEqual(cs[-1].finish_reason, "length")
        # the seed of choice i is seed + i: choice 1 of seed 7 == choice 0 of seed 8
        a = self.c.completions.create(model=MODEL, prompt="Two choices", max_tokens=6, seed=8,
                                      extra_body={"ignore_eos": True})
        c1 = [ch for ch in r.choices if ch.index == 1][0]
        self.assertEqual(a.choices[0].text, c1.text)

    def test_logprobs(self):
        r = self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "lp"}], max_tokens=5,
                                           temperature=0, logprobs=True, top_logprobs=3,
                                           extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 5)
        for e in content:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(len(e.top_logprobs), 3)
            # greedy: the chosen token is the most likely one
            self.assertAlmostEqual(e.logprob, e.top_logprobs[0].logprob, places=4)
        r = self.c.completions.create(model=MODEL, prompt="lp", max_tokens=4, temperature=0, logprobs=2,
                                      extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual(len(lp.token_logprobs), 4)
        # a dict keyed by token text: two alternatives with the same text (e.g. two lone bytes that
        # both print as U+FFFD) share one key, as with OpenAI / vLLM
        self.assertIn(len(lp.top_logprobs[0]), (1, 2))
        self.assertEqual(lp.text_offset[0], 0)
        chunks = list(self.c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "lp"}],
                                                     max_tokens=5, temperature=0, logprobs=True, stream=True,
                                                     extra_body={"ignore_eos": True}))
        n = sum(len(ch.choices[0].logprobs.content) for ch in chunks if ch.choices and ch.choices[0].logprobs)
        self.assertEqual(n, 5)

    # ---- errors ------------------------------------------------------------------------------------
    def err(self, status, body, headers=None, path="/v1/completions", method="POST"):
        st, h, data = self.srv.request(method, path, body, headers)
        self.assertEqual(st, status, data)
        e = json.loads(data)["error"]
        for k in ("message", "type", "param", "code"):
            self.assertIn(k, e)
        return e, h

    def test_error_bad_json(self):
        self.err(400, b'{"model": "tiny", "prompt": ')

    def test_error_invalid_utf8(self):
        self.err(400, b'{"model": "tiny", "prompt": "\xff\xfe"}')

    def test_error_unknown_model(self):
        with self.assertRaises(openai.NotFoundError):
            self.c.completions.create(model="nope", prompt="x", max_tokens=2)
        e, _ = self.err(404, {"model": "nope", "prompt": "x"})
        self.assertEqual(e["param"], "model")

    def test_error_unknown_path_and_method(self):
        self.err(404, None, path="/v1/nothing", method="GET")
        _, h = self.err(405, None, path="/v1/completions", method="GET")
        self.assertEqual(h.get("Allow"), "POST")

    def test_error_body_too_large(self):
        e, _ = self.err(413, {"model": MODEL, "prompt": "x" * (MAX_BODY + 10)})
        # the server keeps serving
        self.assertEqual(self.c.completions.create(model=MODEL, prompt="ok", max_tokens=1).object, "text_completion")

    def test_error_body_too_large_sent_in_full(self):
        # A client that sends its whole oversized body before reading must still get the 413: the
        # server drains the rest before closing (closing with unread bytes sends a RST that loses
        # the response; regression of the load test).
        body = b'{"model": "tiny", "prompt": "' + b"a" * (40 * MAX_BODY) + b'"}'
        s = socket.create_connection(("127.0.0.1", self.srv.port), timeout=30)
        try:
            head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\n\r\n" % len(body)).encode()

            def send():
                try:
                    s.sendall(head + body)
                except OSError:
                    pass
            t = threading.Thread(target=send)
            t.start()
            t.join(30)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            self.assertTrue(data.startswith(b"HTTP/1.1 413"), data[:200])
            self.assertIn(b"Connection: close", data)
        finally:
            s.close()
        self.assertEqual(self.c.completions.create(model=MODEL, prompt="ok", max_tokens=1).object, "text_completion")

    def test_error_bad_params(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.c.completions.create(model=MODEL, prompt="x", temperature=-1)
        self.assertEqual(cm.exception.body["param"], "temperature")
        for body, param in [({"top_p": 0}, "top_p"), ({"temperature": "hot"}, "temperature"),
                            ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"), ({"stop": [""]}, "stop"),
                            ({"presence_penalty": 3}, "presence_penalty"), ({"logprobs": 50}, "logprobs"),
                            ({"prompt": [5000]}, "prompt"), ({"max_tokens": 100000}, "max_tokens"),
                            ({"stream_options": {"include_usage": True}}, "stream_options")]:
            e, _ = self.err(400, dict({"model": MODEL, "prompt": "x"}, **body))
            self.assertEqual(e["param"], param, e)
        e, _ = self.err(400, {"model": MODEL, "messages": [{"content": "x"}]}, path="/v1/chat/completions")
        self.assertEqual(e["param"], "messages")
        e, _ = self.err(400, {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2,
                              "logprobs": False}, path="/v1/chat/completions")
        self.assertEqual(e["param"], "top_logprobs")

    def test_error_api_key(self):
        with self.assertRaises(openai.AuthenticationError):
            self.srv.client("wrong-key").models.list()
        self.err(401, {"model": MODEL, "prompt": "x"}, headers={"Authorization": ""})

    # ---- metrics and disconnects -------------------------------------------------------------------
    def metrics(self):
        st, h, data = self.srv.request("GET", "/metrics")
        self.assertEqual(st, 200)
        self.assertTrue(h["Content-Type"].startswith("text/plain; version=0.0.4"))
        return parse_metrics(data.decode())

    def test_metrics(self):
        self.c.completions.create(model=MODEL, prompt="m", max_tokens=3, extra_body={"ignore_eos": True})
        ms, types = self.metrics()
        for name, typ in [("k3_requests_total", "counter"), ("k3_prompt_tokens_total", "counter"),
                          ("k3_generation_tokens_total", "counter"), ("k3_time_to_first_token_seconds", "histogram"),
                          ("k3_time_per_output_token_seconds", "histogram"),
                          ("k3_e2e_request_latency_seconds", "histogram"), ("k3_num_requests_running", "gauge"),
                          ("k3_num_requests_waiting", "gauge"), ("k3_cache_usage_ratio", "gauge"),
                          ("k3_cache_pages_used", "gauge"), ("k3_cache_state_slots_used", "gauge"),
                          ("k3_cache_pages_total", "gauge"), ("k3_cache_state_slots_total", "gauge"),
                          ("k3_prefix_cache_queries_tokens_total", "counter"),
                          ("k3_prefix_cache_hits_tokens_total", "counter"), ("process_start_time_seconds", "gauge")]:
            self.assertEqual(types.get(name), typ, name)
        self.assertGreaterEqual(metric(ms, "k3_requests_total", endpoint="/v1/completions", status="200"), 1)
        self.assertGreaterEqual(metric(ms, "k3_generation_tokens_total"), 3)
        n = metric(ms, "k3_e2e_request_latency_seconds_count")
        self.assertGreaterEqual(n, 1)
        self.assertEqual(metric(ms, "k3_e2e_request_latency_seconds_bucket", le="+Inf"), n)
        try:
            from prometheus_client.parser import text_string_to_metric_families
        except ImportError:
            return
        st, _, data = self.srv.request("GET", "/metrics")
        names = {f.name for f in text_string_to_metric_families(data.decode())}
        self.assertIn("k3_time_to_first_token_seconds", names)

    def test_grafana_dashboard_reads_this_server(self):
        """docs/grafana/k3-dashboard.json: every k3 metric a panel queries is one the server exports (families
        that exist only with speculation or a file-backed expert cache excepted), and selects model_name."""
        import re
        with open(os.path.join(ROOT, "docs", "grafana", "k3-dashboard.json")) as f:
            dash = json.load(f)
        _, types = self.metrics()
        only_when_enabled = {"k3_spec_decode_acceptance_rate", "k3_spec_decode_mean_acceptance_length",
                             "k3_expert_cache_hit_ratio", "k3_process_disk_read_bytes_total"}
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        self.assertGreaterEqual(len(exprs), 12)
        for e in exprs:
            for name, labels in re.findall(r"\b(k3_[a-z0-9_]+)\{([^}]*)\}", e):
                base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
                self.assertTrue(base in types or base in only_when_enabled, f"{name} in {e!r}")
                self.assertIn('model_name="$model_name"', labels, e)
            self.assertNotRegex(e, r"\bk3_[a-z0-9_]+(?![a-z0-9_{])", f"a k3 metric without the model selector: {e!r}")
        st, _, page = self.srv.request("GET", "/metrics")
        self.assertIn(f'k3_num_requests_running{{model_name="{MODEL}"}}', page.decode())

    def test_zz_disconnect_mid_stream(self):
        gen0 = metric(self.metrics()[0], "k3_generation_tokens_total")
        body = json.dumps({"model": MODEL, "prompt": "long", "max_tokens": 1500, "ignore_eos": True,
                           "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "stream ended early")
            got += chunk
        self.assertIn(b"200 OK", got)
        self.assertIn(b"text/event-stream", got)
        s.close()  # the engine must free the request and the server keep serving
        deadline = time.time() + 30
        while True:
            ms, _ = self.metrics()
            if metric(ms, "k3_num_requests_running") == 0 and metric(ms, "k3_num_requests_waiting") == 0:
                break
            self.assertLess(time.time(), deadline, "request still running after the client left")
            time.sleep(0.05)
        gen = metric(ms, "k3_generation_tokens_total")
        r = self.c.completions.create(model=MODEL, prompt="after", max_tokens=2, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 2)
        self.assertLess(gen - gen0, 1000, "the aborted request went on generating")

    def test_keep_alive_and_concurrency(self):
        c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=60)
        for _ in range(3):  # several requests on one connection
            c.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "k", "max_tokens": 2}),
                      headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            json.loads(r.read())
        c.close()
        errors = []

        def worker(i):
            try:
                chunks = list(self.c.completions.create(model=MODEL, prompt=f"c{i}", max_tokens=4, stream=True,
                                                        extra_body={"ignore_eos": True}))
                assert chunks[-1].choices[0].finish_reason == "length"
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

def msg_fields(m):
    """(content, reasoning_content, tool_calls) of a non-streamed message, tool calls as plain dicts."""
    extra = m.model_extra or {}
    calls = [{"id": t.id, "type": t.type, "name": t.function.name, "arguments": t.function.arguments}
             for t in (m.tool_calls or [])]
    return m.content or "", extra.get("reasoning_content") or "", calls


def stream_fields(chunks):
    """The same fields merged from streamed deltas (as a client does), plus the finish_reason."""
    content, reasoning, calls, fins = "", "", {}, []
    for ch in chunks:
        for c in ch.choices:
            d = c.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for t in d.tool_calls or []:
                e = calls.setdefault(t.index, {"id": "", "type": "function", "name": "", "arguments": ""})
                if t.id:
                    e["id"] = t.id
                if t.type:
                    e["type"] = t.type
                if t.function and t.function.name:
                    e["name"] = t.function.name
                if t.function and t.function.arguments:
                    e["arguments"] += t.function.arguments
            if c.finish_reason:
                fins.append(c.finish_reason)
    return (content, reasoning, [calls[k] for k in sorted(calls)]), fins


WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}]


class ChatTest(unittest.TestCase):
    """Chat through the real XTML format on the trained models/k3-tiny."""

    @classmethod
    def setUpClass(cls):
        # models/k3-tiny is committed: a checkout without it is broken, not a reason to skip
        assert os.path.exists(os.path.join(K3_TINY, "model.safetensors")), "models/k3-tiny is missing"
        cls.srv = ServerProcess(model_dir=K3_TINY)
        cls.c = cls.srv.client()

    @classmethod
    def tearDownClass(cls):
        rc = cls.srv.stop()
        logs = cls.srv.logs()
        cls.srv.cleanup()
        if rc != 0 or "ThreadSanitizer" in logs or "AddressSanitizer" in logs:
            print(logs, file=sys.stderr)
        assert rc == 0, f"server exit code {rc}"
        assert "ThreadSanitizer" not in logs, "TSan reported a problem"

    def assert_clean(self, *texts):
        for t in texts:
            for mk in MARKERS:
                self.assertNotIn(mk, t)
            for tag in ("think<|", "response<|", "think\n<|"):
                self.assertNotIn(tag, t)

    def both(self, **kw):
        """The same request non-streamed and streamed: (message fields, finish_reason, response), equal both ways."""
        kw = dict(model=MODEL, **kw)
        r = self.c.chat.completions.create(**kw)
        chunks = list(self.c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        full = msg_fields(r.choices[0].message)
        streamed, fins = stream_fields(chunks)
        # Tool-call ids are unique per response (they embed the response id); everything else must match.
        strip = lambda f: (f[0], f[1], [{k: v for k, v in c.items() if k != "id"} for c in (f[2] or [])])
        for f in (full, streamed):
            for c in f[2] or []:
                self.assertTrue(c["id"].startswith("call_"), c)
        self.assertEqual(strip(streamed), strip(full))
        self.assertEqual(fins, [r.choices[0].finish_reason])
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)
        self.assert_clean(full[0], full[1])
        return full, r.choices[0].finish_reason, r

    def test_chat(self):
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello!"}]
        r = self.c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.object, "chat.completion")
        m = r.choices[0].message
        self.assertEqual(m.role, "assistant")
        self.assertIsInstance(m.content, str)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 8)
        (content, reasoning, calls), fin, _ = self.both(messages=msgs, max_tokens=8, temperature=0,
                                                        extra_body={"ignore_eos": True})
        self.assertEqual(fin, "length")

    def test_thinking_separates_reasoning(self):
        msgs = [{"role": "user", "content": "Tell me a short story about a cat."}]
        (content, reasoning, calls), fin, r = self.both(messages=msgs, max_tokens=96, temperature=0)
        self.assertIn(fin, ("stop", "length"))
        self.assertEqual(calls, [])
        rc = (r.choices[0].message.model_extra or {}).get("reasoning_content")
        # k3-tiny thinks first on this prompt (greedy, deterministic on the CPU backend): the think block
        # must come back as reasoning_content, equal both ways, and never leak into content
        self.assertIsInstance(rc, str)
        self.assertTrue(rc.strip(), "no reasoning_content with thinking on")
        self.assertEqual(reasoning, rc)
        self.assertNotIn(rc.strip(), content)
        # thinking off: the prompt opens the response channel, nothing is reasoning
        (content2, reasoning2, _), fin2, r2 = self.both(
            messages=msgs, max_tokens=64, temperature=0, extra_body={"chat_template_kwargs": {"thinking": False}})
        self.assertEqual(reasoning2, "")
        self.assertIsNone((r2.choices[0].message.model_extra or {}).get("reasoning_content"))
        self.assertIn(fin2, ("stop", "length"))

    def test_reasoning_in_channel_when_cut_short(self):
        # with thinking on, generation starts inside <|open|>think<|sep|>: whatever comes before the
        # model closes the think block is reasoning_content, never content
        msgs = [{"role": "user", "content": "What is two plus two?"}]
        (content, reasoning, calls), fin, r = self.both(messages=msgs, max_tokens=2, temperature=0,
                                                        extra_body={"chat_template_kwargs": {"thinking": True}})
        self.assertEqual(fin, "length")
        self.assertEqual(content, "")
        self.assertTrue(reasoning.strip(), "the 2 tokens inside the open think block are not reasoning_content")
        self.assertEqual((r.choices[0].message.model_extra or {}).get("reasoning_content"), reasoning)
        self.assertEqual(calls, [])

    def test_stream_equals_nonstream_seeded(self):
        msgs = [{"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "Write two sentences about the sea."}]
        for kw in (dict(temperature=0), dict(temperature=0.9, seed=42), dict(temperature=0.7, seed=7, top_p=0.9),
                   dict(temperature=0, reasoning_effort="low")):
            self.both(messages=msgs, max_tokens=64, **kw)

    def test_tools_end_to_end(self):
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        for kw in (dict(temperature=0), dict(temperature=1.0, seed=3), dict(temperature=1.0, seed=11)):
            (content, reasoning, calls), fin, r = self.both(messages=msgs, tools=WEATHER_TOOLS, tool_choice="auto",
                                                            max_tokens=128, **kw)
            # k3-tiny calls the tool on each of these settings (greedy / seeded, deterministic on the CPU
            # backend), so a parser that loses tool calls fails here (issue 12: the check was inside `if calls:`)
            self.assertTrue(calls, f"no tool call with {kw}: content {content!r}")
            self.assertEqual(fin, "tool_calls")
            ids = set()
            for t in calls:
                self.assertEqual(t["type"], "function")
                self.assertEqual(t["name"], "get_weather")
                self.assertIsInstance(json.loads(t["arguments"]).get("city"), str)
                self.assertTrue(t["id"])
                ids.add(t["id"])
            self.assertEqual(len(ids), len(calls))
        # a follow-up turn with a tool result renders and runs
        follow = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
        self.both(messages=follow, tools=WEATHER_TOOLS, max_tokens=48, temperature=0)
        # tool_choice none: tools stay declared, but no tool calls come back
        (_, _, calls), fin, _ = self.both(messages=msgs, tools=WEATHER_TOOLS, tool_choice="none", max_tokens=64,
                                          temperature=0)
        self.assertEqual(calls, [])
        self.assertIn(fin, ("stop", "length"))
        # required / named: accepted (not enforced) when declared
        self.both(messages=msgs, tools=WEATHER_TOOLS, tool_choice="required", max_tokens=32, temperature=0)
        self.both(messages=msgs, tools=WEATHER_TOOLS, max_tokens=32, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})

    def test_chat_max_completion_tokens_and_extras(self):
        r = self.c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "parts"}]}],
            max_completion_tokens=3, temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5,
            reasoning_effort="low", tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice="auto",
            extra_body={"ignore_eos": True, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                        "chat_template_kwargs": {"thinking": False}})
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_chat_errors(self):
        def err(body):
            st, _, data = self.srv.request("POST", "/v1/chat/completions",
                                           dict({"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                                                **body))
            self.assertEqual(st, 400, data)
            return json.loads(data)["error"]["param"]
        self.assertEqual(err({"tool_choice": "required"}), "tool_choice")  # no tools
        self.assertEqual(err({"tools": WEATHER_TOOLS,
                              "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice")
        self.assertEqual(err({"tools": [{"type": "function"}]}), "tools")
        self.assertEqual(err({"reasoning_effort": "extreme"}), "reasoning_effort")
        self.assertEqual(err({"messages": [{"role": "tool", "content": "r"}]}), "messages")


class HostNameTest(unittest.TestCase):
    def test_host_given_as_a_name(self):
        # `--host localhost` (vLLM's and llama-server's habit) binds the name's IPv4 address, 127.0.0.1.
        srv = ServerProcess(extra=("--host", "localhost"))
        try:
            st, _, body = srv.request("GET", "/version")
            self.assertEqual(st, 200, body)
        finally:
            srv.stop(signal.SIGKILL)
            srv.cleanup()


class ShutdownTest(unittest.TestCase):
    def test_sigterm_ends_streams_cleanly(self):
        srv = ServerProcess(extra=("--shutdown-grace", "1"), max_model_len=32768)
        try:
            c = srv.client()
            done = {}

            def stream():
                chunks = list(c.completions.create(model=MODEL, prompt="long", max_tokens=32000, stream=True,
                                                   extra_body={"ignore_eos": True}))
                done["fin"] = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]

            t = threading.Thread(target=stream)
            t.start()
            time.sleep(0.5)
            rc = srv.stop(signal.SIGTERM)
            t.join(30)
            logs = srv.logs()
            self.assertEqual(rc, 0, logs)
            self.assertEqual(done.get("fin"), "abort")
            self.assertIn("grace period over", logs)
            self.assertNotIn("ThreadSanitizer", logs)
        finally:
            srv.stop(signal.SIGKILL)
            srv.cleanup()


class WebUiTest(unittest.TestCase):
    """The web chat's files at / (the browser test, tests/browser, drives the page itself): public like
    /health, Content-Type, ETag + 304, CSP; --no-webui takes them away."""

    def test_assets_served_with_validators(self):
        srv = ServerProcess()
        try:
            for path, ctype in (("/", "text/html"), ("/static/app.js", "text/javascript"), ("/static/style.css", "text/css")):
                st, h, body = srv.request("GET", path, headers={"Authorization": ""})  # no API key needed
                self.assertEqual(st, 200, path)
                self.assertTrue(h["Content-Type"].startswith(ctype), h)
                self.assertEqual(h["X-Content-Type-Options"], "nosniff")
                self.assertNotIn("Access-Control-Allow-Origin", h)
                st2, h2, body2 = srv.request("GET", path, headers={"If-None-Match": 'W/"x", ' + h["ETag"]})
                self.assertEqual((st2, body2), (304, b""), path)
                self.assertEqual(h2["ETag"], h["ETag"])
            st, h, body = srv.request("GET", "/")
            self.assertIn(b'<script src="/static/app.js"', body)
            self.assertIn("script-src 'self'", h["Content-Security-Policy"])
            self.assertNotIn("unsafe-inline", h["Content-Security-Policy"])
            self.assertEqual(srv.request("GET", "/static/nope.js")[0], 404)
            self.assertEqual(srv.request("GET", "/static/../index.html")[0], 404)
            self.assertEqual(srv.request("POST", "/", body="{}")[0], 405)
            # /v1/* still needs the key.
            self.assertEqual(srv.request("GET", "/v1/models", headers={"Authorization": ""})[0], 401)
        finally:
            self.assertEqual(srv.stop(), 0)
            srv.cleanup()

    def test_sigterm_as_soon_as_healthy_is_graceful(self):
        # An orchestrator may stop a replica the moment it answers /health: that must be the graceful shutdown (exit
        # 0), not SIGTERM's default kill. Session 60's CI saw -15 once (the handler was installed after serving began).
        for _ in range(3):
            srv = ServerProcess()
            try:
                self.assertEqual(srv.stop(), 0, srv.logs())
            finally:
                srv.cleanup()

    def test_no_cors_on_assets(self):
        srv = ServerProcess(extra=["--allowed-origins", "*"])
        try:
            origin = {"Origin": "http://other.example"}
            self.assertEqual(srv.request("GET", "/version", headers=origin)[1].get("Access-Control-Allow-Origin"), "*")
            st, h, _ = srv.request("GET", "/", headers=origin)
            self.assertEqual(st, 200)
            self.assertNotIn("Access-Control-Allow-Origin", h)
        finally:
            self.assertEqual(srv.stop(), 0)
            srv.cleanup()

    def test_no_webui(self):
        srv = ServerProcess(extra=["--no-webui"])
        try:
            for path in ("/", "/index.html", "/static/app.js"):
                self.assertEqual(srv.request("GET", path)[0], 404, path)
            self.assertEqual(srv.request("GET", "/health")[0], 200)
        finally:
            self.assertEqual(srv.stop(), 0)
            srv.cleanup()


if __name__ == "__main__":
    unittest.main()
