"""A real local HTTP receiver for the alert tests (and the collector that tests/test_telemetry.py
exports OTLP to): a threaded http.server in the test process.

`Receiver(script)` answers each POST with the next entry of `script` (an HTTP status, or
"hang" to hold the connection past the sender's timeout), then with `default` once the script
is used up, and records every request (headers and body) it received.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, script=(), default: int = 200, hang_seconds: float = 3.0):
        self.script = list(script)
        self.default = default
        self.hang_seconds = hang_seconds
        self.requests: list[dict] = []
        self.answers: list[object] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    answer = receiver.script.pop(0) if receiver.script else receiver.default
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                              "answer": answer, "at": time.time()})
                if answer == "hang":
                    receiver._release.wait(receiver.hang_seconds)
                    return
                self.send_response(int(answer))
                text = b"ok" if int(answer) < 300 else b"nope"
                if int(answer) == 429:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def json_bodies(self) -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests]

    def delivered(self) -> list[dict]:
        """Requests that got a 2xx answer."""
        return [r for r in self.requests if r["answer"] != "hang" and 200 <= int(r["answer"]) < 300]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
