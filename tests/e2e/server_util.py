"""What the server tests share without the openai client (test_server.py, tests/mpi/serve_tp.py, serve_dp.py):
ports, process trees, raw HTTP, waiting for /health, server logs, the Prometheus text format. serve_tp.py needs only
this, so it runs where the openai package is not installed (the GPU machines)."""
import http.client
import json
import os
import socket
import time

MODEL = "tiny"  # the served model name the e2e suite uses (metric()'s default model_name label)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid):
    """Every process below pid (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def mpi_rank0_below(pid):
    """The process below pid that mpirun started as rank 0 (OMPI_COMM_WORLD_RANK=0), or pid itself."""
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if b"OMPI_COMM_WORLD_RANK=0\0" in f.read():
                    return p
        except OSError:
            pass
    return pid


def http_request(port, method, path, body=None, timeout=120):
    """(status, body bytes) of one request to 127.0.0.1:port, a JSON body when given (the helper classes share it)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"} if body is not None else {}
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_healthy(proc, port, logs, limit_s, give_up):
    """Polls /health until 200 (returns the seconds it took); raises with the log when the process exits or
    limit_s pass (after give_up())."""
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            raise RuntimeError("server exited early:\n" + logs())
        try:
            if http_request(port, "GET", "/health", timeout=5)[0] == 200:
                return time.time() - t0
        except OSError:
            pass
        if time.time() - t0 > limit_s:
            give_up()
            raise RuntimeError("server did not become healthy:\n" + logs())
        time.sleep(0.05)


def read_log(f):
    """Everything written so far to a server's log file object."""
    f.flush()
    f.seek(0)
    return f.read()


def parse_metrics(text):
    """Prometheus text format -> {(name, frozenset(labels.items())): value}; checks HELP/TYPE lines."""
    out, types = {}, {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
            continue
        if line.startswith("#"):
            continue
        metric, value = line.rsplit(" ", 1)
        labels = {}
        if "{" in metric:
            name, rest = metric.split("{", 1)
            for part in rest.rstrip("}").split(","):
                if part:
                    k, v = part.split("=", 1)
                    labels[k] = json.loads(v)
        else:
            name = metric
        base = name
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and name[: -len(suf)] in types:
                base = name[: -len(suf)]
        assert base in types, f"metric {name} has no TYPE line"
        out[(name, frozenset(labels.items()))] = float(value)
    return out, types


def metric(ms, name, **labels):
    """The sample of `name` with exactly `labels` besides model_name (vLLM's label on every k3 metric)."""
    if name != "process_start_time_seconds":
        labels.setdefault("model_name", MODEL)
    return ms.get((name, frozenset(labels.items())))
