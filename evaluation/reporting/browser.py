"""Drive headless Chromium over the DevTools protocol on a pipe (stdlib only).

Why a pipe: ``--remote-debugging-pipe`` speaks CDP as NUL-terminated JSON on file
descriptors 3 (commands in) and 4 (replies out), so no websocket client or port is needed.
Used by the report's browser test and to take the documentation screenshot.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]


def find_chromium() -> Optional[str]:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.path.exists(path):
            return path
    return None


class Browser:
    """One headless Chromium with one page; collects console errors and uncaught exceptions."""

    def __init__(self, binary: Optional[str] = None, width: int = 1280, height: int = 900,
                 timeout: float = 60.0) -> None:
        self.binary = binary or find_chromium()
        if not self.binary:
            raise RuntimeError("chromium not found")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="report-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def remap() -> None:  # runs in the child: put the pipe ends on fds 3 and 4
            a = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)  # dup2 leaves the new descriptors inheritable
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=remap, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: List[Dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(domain, session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    # -- protocol ------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw.decode("utf-8"))

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, session: bool = False) -> Dict[str, Any]:
        self._id += 1
        msg: Dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode("utf-8") + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    # -- page helpers ----------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading")
            time.sleep(0.05)

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, session=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"JavaScript error evaluating {expression[:80]!r}: "
                               f"{res['exceptionDetails'].get('text')} "
                               f"{res['exceptionDetails'].get('exception', {}).get('description', '')}")
        return res.get("result", {}).get("value")

    def errors(self) -> List[str]:
        """Uncaught exceptions, console.error calls and error log entries seen so far."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                        for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} ({p['entry'].get('url', '')})")
        return out

    def screenshot(self, path: str, full_page: bool = False, clip_height: Optional[int] = None) -> str:
        params: Dict[str, Any] = {"format": "png"}
        if full_page or clip_height:
            width = self.evaluate("document.documentElement.scrollWidth")
            height = clip_height or self.evaluate("document.documentElement.scrollHeight")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        data = self.call("Page.captureScreenshot", params, session=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:  # noqa: BLE001 - closing a browser that already went away
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
