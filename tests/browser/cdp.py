"""A minimal Chrome DevTools Protocol client over --remote-debugging-pipe (stdlib only: no WebSocket, no
Selenium, no chromedriver). Chromium reads commands on fd 3 and writes replies and events on fd 4, each a
JSON message ended by a NUL byte."""
import base64
import json
import os
import subprocess
import threading
import time


class CdpError(RuntimeError):
    pass


class Browser:
    def __init__(self, chromium, user_data_dir, width=1200, height=820):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds():
            # Move both ends out of the way first, so neither dup2 clobbers the other.
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--mute-audio",
                "--remote-debugging-pipe", f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}",
                "about:blank"]
        os.makedirs(user_data_dir, exist_ok=True)
        self.log = open(os.path.join(os.path.dirname(user_data_dir), "chromium.log"), "w+")
        self.proc = subprocess.Popen(args, preexec_fn=child_fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT, close_fds=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._replies = {}
        self.events = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session = None

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cv:
                    self._replies[None] = "closed"
                    self._cv.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cv:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cv.notify_all()

    def send(self, method, params=None, session=True, timeout=30):
        with self._lock:
            self._next_id += 1
            mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        with self._cv:
            while mid not in self._replies:
                if None in self._replies:
                    raise CdpError(f"chromium closed the pipe during {method}")
                left = deadline - time.time()
                if left <= 0:
                    raise CdpError(f"{method}: no reply in {timeout} s")
                self._cv.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method, timeout=30):
        """The first not yet taken event named `method` (removed from the list)."""
        deadline = time.time() + timeout
        with self._cv:
            while True:
                for i, ev in enumerate(self.events):
                    if ev.get("method") == method:
                        return self.events.pop(i)["params"]
                left = deadline - time.time()
                if left <= 0:
                    raise CdpError(f"no {method} event in {timeout} s")
                self._cv.wait(left)

    def open_page(self):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        self.send("Page.enable")

    def eval(self, expression, timeout=30):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                      timeout=timeout)
        if "exceptionDetails" in r:
            raise CdpError(f"evaluate({expression[:80]}): {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression, timeout=30, what=None):
        deadline = time.time() + timeout
        while True:
            v = self.eval(expression)
            if v:
                return v
            if time.time() > deadline:
                raise CdpError(f"timed out after {timeout} s waiting for {what or expression}")
            time.sleep(0.05)

    def navigate(self, url):
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", what="the page to load")

    def reload(self):
        self.eval("window.__reloading = 1")
        self.send("Page.reload", {"ignoreCache": False})
        self.wait_for("!window.__reloading && document.readyState === 'complete'", what="the reload")

    def type_text(self, selector, text):
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", {"text": text})

    def press_enter(self):
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                 "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13,
                                                 **({"text": "\r"} if kind == "keyDown" else {})})

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except CdpError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        self.log.close()
