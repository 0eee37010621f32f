"""The demo's stand-in for an on-call pager: a local webhook receiver for Skiplock's alerts.

`skiplock demo` runs it as a child process and points a `[[webhooks]]` destination of kind
`json` at it, so alerts that fire in the demo are really delivered, signed, through the outbox.
It checks the `X-Skiplock-Signature` header with the shared secret (from the environment
variable DEMO_WEBHOOK_SECRET), prints one line per notification (to the demo's
logs/webhooks.log) and answers 200, or 401 when the signature does not verify.

It stores nothing; the console's delivery log is the record.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/hook"


def verify(secret: str, header: str, body: bytes, *, tolerance: float = 300.0) -> bool:
    """`t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, refused when older than `tolerance`."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields.get("v1", ""))


def describe(payload: dict) -> str:
    """One line for a notification: event, severity, rule, labels and summary."""
    alert = payload.get("alert") or {}
    labels = ",".join(f"{k}={v}" for k, v in sorted((alert.get("labels") or {}).items()))
    return (f"{str(payload.get('event', '?')).upper():<8} {alert.get('severity', '-'):<8} {alert.get('rule', '-')}"
            f"{'{' + labels + '}' if labels else ''}: {alert.get('summary', '')}")


class Receiver(BaseHTTPRequestHandler):
    server_version = "skiplock-demo-receiver"
    secret = ""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 1_000_000))
        if self.path != PATH:
            self._answer(404, "not found")
            return
        if self.secret and not verify(self.secret, self.headers.get("X-Skiplock-Signature", ""), body):
            print("REFUSED  a notification whose signature does not verify", flush=True)
            self._answer(401, "bad signature")
            return
        try:
            payload = json.loads(body)
        except ValueError:
            self._answer(400, "not JSON")
            return
        print(f"{time.strftime('%H:%M:%S')} {describe(payload)}", flush=True)
        self._answer(200, "ok")

    def _answer(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # one line per notification is enough
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m console.demo.receiver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    Receiver.secret = os.environ.get("DEMO_WEBHOOK_SECRET", "")
    server = ThreadingHTTPServer((args.host, args.port), Receiver)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening on http://{args.host}:{args.port}{PATH} for Skiplock's alert webhooks", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
