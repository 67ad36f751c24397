"""`k3 serve --tp 2` against one process, through the HTTP API (issue 16): greedy text identical (plain,
streamed, chat, concurrent under preemption, after a prefix-cache hit), cancellation, a worker killed
mid-generation (the client gets an error, /health turns 503, the server exits non-zero within seconds),
and no orphan workers after SIGTERM / SIGKILL of rank 0.

The TP server is started the way users start it: `k3 serve --tp 2` with no launcher (rank 0 spawns its
worker), or under K3_TP_LAUNCHER (e.g. "mpirun -np 2 --oversubscribe") when that is set. K3_SERVE_ARGS: more
flags for every server of the run, the one-process reference too (e.g. "--device cuda" on a GPU machine).
usage: serve_tp.py K3_BINARY [unittest args]; environment as the mpi CTests (K3_CPU_ISA=exact, root allowed).
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import server_util as e2e  # noqa: E402  (free_port, descendants, parse_metrics, metric; no openai needed)

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "release", "k3")
MODEL_DIR = os.path.join(ROOT, "models", "k3-tiny")
# KDA state checkpoints every 16 tokens: a repeated prompt hits the prefix cache.
COMMON = ["--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--page-size", "16", "--checkpoint-interval", "16",
          "--enable-prompt-tokens-details"]
PROMPTS = ["Once upon a time", "The little robot", "In the morning, the sun", "She opened the door and"]


class Server:
    def __init__(self, tp, extra=()):
        self.tmp = tempfile.TemporaryDirectory()
        self.port = e2e.free_port()
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+")
        launcher = os.environ.get("K3_TP_LAUNCHER", "").split() if tp > 1 else []
        cmd = [*launcher, BIN, "serve", "-m", MODEL_DIR, "--port", str(self.port), "--served-model-name", "m",
               *COMMON, *os.environ.get("K3_SERVE_ARGS", "").split(), *extra] + (["--tp", str(tp)] if tp > 1 else [])
        env = dict(os.environ, K3_NUM_THREADS="1")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.ready_s = e2e.wait_healthy(self.proc, self.port, self.logs, 120, self.kill)
        self.tree = [self.proc.pid] + e2e.descendants(self.proc.pid)

    def logs(self):
        return e2e.read_log(self.log)

    def request(self, method, path, body=None, timeout=120):
        return e2e.http_request(self.port, method, path, body, timeout)

    def complete(self, prompt, n=40, **kw):
        st, data = self.request("POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": n,
                                                            "temperature": 0, "ignore_eos": True, **kw})
        assert st == 200, (st, data)
        return json.loads(data)

    def stream(self, prompt, n=40):
        """The streamed text of one completion, and the raw events."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": prompt, "max_tokens": n,
                                                               "temperature": 0, "ignore_eos": True, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read().decode()
        c.close()
        text = ""
        for line in raw.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if ev.get("choices"):
                    text += ev["choices"][0].get("text") or ""
        return text, raw

    def metrics(self):
        st, data = self.request("GET", "/metrics")
        assert st == 200
        return e2e.parse_metrics(data.decode())[0]

    def worker_pids(self):
        """The k3 processes below ours other than rank 0 (spawned: below OpenMPI's orted; mpirun: its ranks)."""
        out = []
        for pid in e2e.descendants(self.proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0].decode()) == os.path.basename(BIN) and b"serve" in argv:
                out.append(pid)
        return [p for p in out if p != self.rank0_pid()]

    def rank0_pid(self):
        if not os.environ.get("K3_TP_LAUNCHER"):
            return self.proc.pid
        return e2e.mpi_rank0_below(self.proc.pid)

    def kill(self):
        for pid in self.tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            os.kill(self.rank0_pid(), sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def cleanup(self):
        self.log.close()
        self.tmp.cleanup()


def alive(pids):
    """The pids that still run (zombies excluded)."""
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    out.append(p)
        except OSError:
            pass
    return out


class TpMatchesOneProcess(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = Server(1, ["--cache-memory", "1GiB"])
        cls.tp = Server(2, ["--cache-memory", "1GiB"])
        print(f"\n[serve_tp] ready: 1 process {cls.ref.ready_s:.2f} s, --tp 2 {cls.tp.ready_s:.2f} s "
              f"(launcher: {os.environ.get('K3_TP_LAUNCHER') or 'none, k3 spawns its worker'})", file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        rcs = (cls.tp.stop(), cls.ref.stop())
        logs = cls.tp.logs()
        deadline = time.time() + 10  # OpenMPI's runtime (orted) ends a moment after rank 0
        while alive(cls.tp.tree) and time.time() < deadline:
            time.sleep(0.1)
        left = alive(cls.tp.tree)
        cls.tp.cleanup()
        cls.ref.cleanup()
        assert rcs == (0, 0), f"exit statuses {rcs}:\n{logs}"
        assert not left, f"processes left after SIGTERM: {left}"

    def test_tp_really_runs_two_ranks(self):
        self.assertEqual(len(self.tp.worker_pids()), 1, self.tp.logs())
        self.assertIn("k3: rank 1/2:", self.tp.logs())

    def test_greedy_text_identical(self):
        for p in PROMPTS:
            a, b = self.ref.complete(p), self.tp.complete(p)
            self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"], p)
            self.assertEqual(b["usage"]["completion_tokens"], 40)

    def test_stream_identical(self):
        want = self.ref.complete(PROMPTS[0], n=30)["choices"][0]["text"]
        text, raw = self.tp.stream(PROMPTS[0], n=30)
        self.assertEqual(text, want, raw)
        self.assertTrue(raw.rstrip().endswith("data: [DONE]"), raw[-200:])

    def test_chat_identical(self):
        body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a story about a cat."}],
                "max_tokens": 40, "temperature": 0}
        a = json.loads(self.ref.request("POST", "/v1/chat/completions", body)[1])
        b = json.loads(self.tp.request("POST", "/v1/chat/completions", body)[1])
        self.assertEqual(a["choices"][0]["message"], b["choices"][0]["message"])

    def test_prefix_cache_hit(self):
        prompt = "A long shared beginning of a story that both requests send. " * 6
        first = self.tp.complete(prompt, n=10)
        hits0 = e2e.metric(self.tp.metrics(), "k3_prefix_cache_hits_tokens_total", model_name="m")
        second = self.tp.complete(prompt, n=10)
        hits1 = e2e.metric(self.tp.metrics(), "k3_prefix_cache_hits_tokens_total", model_name="m")
        self.assertGreater(second["usage"]["prompt_tokens_details"]["cached_tokens"], 0, second["usage"])
        self.assertGreater(hits1, hits0)
        self.assertEqual(first["choices"][0]["text"], second["choices"][0]["text"])
        self.assertEqual(second["choices"][0]["text"], self.ref.complete(prompt, n=10)["choices"][0]["text"])

    def test_zz_cancel_mid_stream(self):
        c = http.client.HTTPConnection("127.0.0.1", self.tp.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": "x", "max_tokens": 3000,
                                                               "ignore_eos": True, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        for _ in range(3):
            r.readline()
        c.close()  # the client leaves: the engine must drop the request on both ranks and go on serving
        deadline = time.time() + 30
        while e2e.metric(self.tp.metrics(), "k3_num_requests_running", model_name="m") != 0:
            self.assertLess(time.time(), deadline, "the cancelled request still runs")
            time.sleep(0.05)
        self.assertEqual(self.tp.complete(PROMPTS[1])["choices"][0]["text"],
                         self.ref.complete(PROMPTS[1])["choices"][0]["text"])


class TpUnderPreemption(unittest.TestCase):
    # Each request (150 tokens + the prompt) takes 10 pages of 16 tokens. The TP ranks' cache at 1000 KiB holds
    # 16 pages (256 tokens), so any two requests that overlap near their ends force a preemption; at 1500 KiB (34 pages) all
    # four had to overlap, and once (session 19's CI, a quiet 2-core box) the first finished before the last was
    # admitted: no preemption, the assertion below failed. The barrier sends the four together. The reference
    # (one process: all heads, so fewer tokens per KiB) keeps 1500 KiB, enough for one request at a time.
    N = 150

    def test_concurrent_requests_preempted_give_the_same_text(self):
        ref = Server(1, ["--cache-memory", "1500KiB"])
        try:
            want = {p: ref.complete(p, n=self.N)["choices"][0]["text"] for p in PROMPTS}
        finally:
            ref.stop()
            ref.cleanup()
        tp = Server(2, ["--cache-memory", "1000KiB"])
        try:
            got, errors = {}, []
            start = threading.Barrier(len(PROMPTS))

            def run(p):
                try:
                    start.wait()
                    got[p] = tp.complete(p, n=self.N)["choices"][0]["text"]
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            ts = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errors, [])
            self.assertGreater(e2e.metric(tp.metrics(), "k3_num_preemptions_total", model_name="m"), 0, tp.logs())
            self.assertEqual(got, want)
        finally:
            self.assertEqual(tp.stop(), 0, tp.logs())
            tp.cleanup()


class TpWorkerLoss(unittest.TestCase):
    def test_worker_killed_mid_generation(self):
        srv = Server(2)
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            c.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": "x", "max_tokens": 4000,
                                                                   "ignore_eos": True, "stream": True}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            events = 0
            while events < 5:  # generation under way
                if r.readline().startswith(b"data: "):
                    events += 1
            workers = srv.worker_pids()
            self.assertEqual(len(workers), 1)
            killed_at = time.time()
            os.kill(workers[0], signal.SIGKILL)
            rest = b""
            try:
                rest = r.read()  # the stream must end (with an error event), not hang
            except (OSError, http.client.HTTPException) as e:
                rest += repr(e).encode()
            answered_s = time.time() - killed_at
            c.close()
            health = None
            try:
                health = srv.request("GET", "/health", timeout=5)
            except OSError:
                pass  # already gone: also not healthy
            rc = srv.proc.wait(20)
            exited_s = time.time() - killed_at
            print(f"\n[serve_tp] worker killed: the stream ended after {answered_s:.2f} s, /health "
                  f"{health[0] if health else 'refused'}, server exit {rc} after {exited_s:.2f} s", file=sys.stderr)
            tail = rest.decode(errors="replace")[-600:]
            self.assertIn("the tensor-parallel group lost a rank: rank 1 (pid", tail)
            self.assertIn('"type":"server_error"', tail)
            self.assertLess(answered_s, 10)
            if health is not None:
                self.assertEqual(health[0], 503, health)
            if os.environ.get("K3_TP_LAUNCHER"):
                self.assertNotEqual(rc, 0)  # mpirun ends the job when a rank dies, with its own status
            else:
                self.assertEqual(rc, 1)
                self.assertIn("k3: error: k3 serve stopped: the tensor-parallel group lost a rank", srv.logs())
            deadline = time.time() + 10
            while alive(srv.tree) and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(alive(srv.tree), [], "processes left")
        finally:
            srv.kill()
            srv.cleanup()


class TpNoOrphans(unittest.TestCase):
    def test_sigkill_of_rank0_ends_the_workers(self):
        srv = Server(2)
        try:
            tree = srv.tree
            self.assertGreaterEqual(len(tree), 2)
            os.kill(srv.rank0_pid(), signal.SIGKILL)
            deadline = time.time() + 15
            while alive(tree) and time.time() < deadline:
                time.sleep(0.1)
            self.assertEqual(alive(tree), [], "workers outlived rank 0")
        finally:
            srv.kill()
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], *sys.argv[2:]], verbosity=2)
