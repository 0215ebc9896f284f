"""Minimal DevTools-protocol client over --remote-debugging-pipe: load a page, collect errors, measure images."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "chromium", "chromium-browser")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-extensions", "--disable-sync", "--no-first-run", "--no-default-browser-check",
    "--mute-audio", "--remote-debugging-pipe",
)
IMAGES_JS = (
    "JSON.stringify([...document.images].map(i => ({src: i.getAttribute('src'), "
    "complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})))"
)


def find_chromium() -> str | None:
    for cand in CANDIDATES:
        path = shutil.which(cand) if not os.path.isabs(cand) else (cand if os.access(cand, os.X_OK) else None)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium; fd 3 carries our commands to it, fd 4 its replies."""

    def __init__(self, binary: str, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="foscar-chromium-")
        to_child_r, self._write = os.pipe()
        self._read, from_child_w = os.pipe()

        def wire_fds() -> None:  # runs in the child, before exec
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=wire_fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._write, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _receive(self) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._read], [], [], max(left, 0))
            if not ready:
                raise TimeoutError(f"chromium sent nothing for {self.timeout_s:.0f} s")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def wait_for(self, method: str, session: str) -> None:
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.events.append(self._receive())

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:  # noqa: BLE001 - it may already be gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._write)
        os.close(self._read)
        shutil.rmtree(self.profile, ignore_errors=True)


def load_page(binary: str, path: Path) -> dict:
    """{'errors': [...], 'images': [...]} for the page at `path` once its load event fired."""
    browser = Browser(binary)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired", session)
        images = json.loads(browser.send("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True},
                                         session=session)["result"]["value"])
        return {"errors": _errors(browser.events), "images": images}
    finally:
        browser.close()


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            desc = details.get("exception", {}).get("description", "")
            out.append(f"exception: {details.get('text', '?')} {desc}".strip())
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append(f"log: {entry.get('text')} {entry.get('url', '')}")
    return out
