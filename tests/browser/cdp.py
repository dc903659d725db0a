"""A minimal Chrome DevTools Protocol client on the standard library only: starts headless
Chromium with remote debugging (its log in the profile directory), opens one page, evaluates JavaScript in it and takes
screenshots over the page's WebSocket (RFC 6455 client frames, masked; text and continuation
frames read back)."""

import base64
import json
import os
import re
import socket
import struct
import subprocess
import time
import urllib.request


class WebSocket:
    def __init__(self, url, timeout):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\n"
             f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
             "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")

    def send(self, text):
        data = text.encode()
        header = bytes([0x81])
        n = len(data)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _exact(self, n):
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("websocket closed")
            out += chunk
        return bytes(out)

    def receive(self):
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise ConnectionError("websocket closed by the browser")
            if opcode in (0, 1, 2):
                message += payload
                if b0 & 0x80:
                    return message.decode()


class Browser:
    """Headless Chromium showing `url`; close() ends it."""

    def __init__(self, chromium, url, profile_dir, timeout=60, flags=()):
        self.timeout = timeout
        self.log = open(os.path.join(profile_dir, "chromium.log"), "w")
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
             f"--user-data-dir={profile_dir}", "--window-size=1200,1400", *flags, url],
            stdout=self.log, stderr=subprocess.STDOUT)
        # Chromium writes the port it chose to <profile>/DevToolsActivePort (first line).
        port = None
        deadline = time.monotonic() + timeout
        active = os.path.join(profile_dir, "DevToolsActivePort")
        while port is None and time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with open(active) as f:
                    first = f.readline().strip()
                port = int(first) if first.isdigit() else None
            except FileNotFoundError:
                pass
            if port is None:
                time.sleep(0.1)
        if port is None:
            self.close()
            with open(os.path.join(profile_dir, "chromium.log")) as f:
                raise RuntimeError(f"chromium did not open its DevTools port: {f.read()[-2000:]}")
        page = None
        while page is None and time.monotonic() < deadline:
            listing = urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10)
            targets = json.load(listing)
            page = next((t for t in targets if t.get("type") == "page"), None)
            if page is None:
                time.sleep(0.2)
        if page is None:
            self.close()
            raise RuntimeError("chromium opened no page")
        self.ws = WebSocket(page["webSocketDebuggerUrl"], timeout)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.receive())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, what, expression, timeout):
        """Polls `expression` until it is truthy (bounded); returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.2)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))

    def close(self):
        self.log.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
