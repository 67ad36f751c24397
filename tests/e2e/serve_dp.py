"""`k3 serve --data-parallel-size 2` (-dp 2) against `k3 serve` through the HTTP API, on the built-in model
(CPU): concurrent greedy requests get the same text from two replicas as from one engine (the CPU engine's
outputs do not depend on batching), /metrics sums both replicas (their caches and the requests), /health
answers; -dp with --tp is refused with one clear error and exit status 1 before anything loads.

Stdlib only. usage: serve_dp.py K3_BINARY [unittest args]; environment as the other e2e CTests (K3_CPU_ISA=exact).
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import test_server as e2e  # noqa: E402  (http_request, read_log)
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "release", "k3")
MODEL_DIR = os.path.join(ROOT, "models", "k3-tiny")
# A size, not a fraction: per replica, so the two-replica server holds twice the pages.
COMMON = ["--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--cache-memory", "64MiB", "--no-webui"]
SHARED = "In a small village at the edge of a great forest there lived an old woodcutter who"
PROMPTS = ["Once upon a time", "The little robot", "In the morning, the sun", "She opened the door and",
           SHARED + " had three sons", SHARED + " never spoke", "The cat sat on", "Long ago, in a kingdom"]
TOKENS = 24


def parse_metrics(text):
    """{(name, frozenset(labels other than model_name)): value} of a Prometheus text page (e2e's parser)."""
    return {(name, frozenset((k, v) for k, v in labels if k != "model_name")): value
            for (name, labels), value in e2e.parse_metrics(text)[0].items()}


class Server:
    def __init__(self, extra=()):
        self.tmp = tempfile.TemporaryDirectory()
        self.port = e2e.free_port()
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+")
        cmd = [BIN, "serve", "-m", MODEL_DIR, "--port", str(self.port), "--served-model-name", "m", *COMMON, *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        e2e.wait_healthy(self.proc, self.port, self.logs, 60, self.stop)

    def logs(self):
        return e2e.read_log(self.log)

    def request(self, method, path, body=None, timeout=120):
        return e2e.http_request(self.port, method, path, body, timeout)

    def complete_all(self, prompts):
        """Greedy completions of every prompt, all in flight at once; their texts in prompt order."""
        out = [None] * len(prompts)

        def one(i):
            st, data = self.request("POST", "/v1/completions", {"model": "m", "prompt": prompts[i], "max_tokens": TOKENS,
                                                                "temperature": 0, "ignore_eos": True})
            out[i] = (st, json.loads(data))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for st, body in out:
            assert st == 200, (st, body)
            assert body["usage"]["completion_tokens"] == TOKENS, body
        return [body["choices"][0]["text"] for _, body in out]

    def metrics(self):
        st, data = self.request("GET", "/metrics")
        assert st == 200
        return parse_metrics(data.decode())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.tmp.cleanup()
        return self.proc.returncode


class DataParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        one = Server()
        try:
            cls.reference = one.complete_all(PROMPTS)
            cls.one_metrics = one.metrics()
        finally:
            cls.one_rc = one.stop()
        cls.srv = Server(["-dp", "2"])

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def test_same_text_as_one_engine(self):
        self.assertEqual(self.one_rc, 0)
        self.assertEqual(len(set(self.reference)), len(PROMPTS), self.reference)  # the prompts do differ
        # Twice: the second round's shared prefixes are prefix-cache hits on whichever replica they meet.
        for _ in range(2):
            self.assertEqual(self.srv.complete_all(PROMPTS), self.reference)

    def test_metrics_and_health_cover_both_replicas(self):
        self.srv.complete_all(PROMPTS[:4])
        m = self.srv.metrics()
        one = self.one_metrics
        pages = ("k3_cache_pages_total", frozenset())
        slots = ("k3_cache_state_slots_total", frozenset())
        self.assertGreater(one[pages], 0)
        self.assertEqual(m[pages], 2 * one[pages])  # the summed caches of two replicas of --cache-memory each
        self.assertEqual(m[slots], 2 * one[slots])
        ok = m[("k3_requests_total", frozenset({("endpoint", "/v1/completions"), ("status", "200")}))]
        self.assertGreaterEqual(ok, 4)
        self.assertGreaterEqual(m[("k3_prompt_tokens_total", frozenset())], 4)
        self.assertEqual(m[("k3_num_requests_running", frozenset())], 0)
        self.assertEqual(self.srv.request("GET", "/health")[0], 200)
        self.assertIn("data parallel 2 replicas (devices cpu, cpu)", self.srv.logs())

    def test_tensor_parallel_refused(self):
        t0 = time.time()
        r = subprocess.run([BIN, "serve", "-m", MODEL_DIR, "--port", "0", "-dp", "2", "--tp", "2"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--data-parallel-size with tensor parallel is not supported yet", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)  # that one line: nothing loaded, no worker started
        self.assertLess(time.time() - t0, 10)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[2:])
