"""On-call users for the soak (`bench/soak.py` runs Locust headless with this file).

Each simulated user signs in once, then polls what an on-call engineer keeps open: the
overview, the queues, the dead letters, the jobs browser, the database page, their htmx
fragments, and the JSON API with a bearer token. Every answer of 500 or more, and every
connection failure, is appended to `SOAK_FAILURES` (one JSON line: time, path, status) so the
soak can tell failures inside a fault's window from failures outside any.

Environment: SOAK_USER, SOAK_PASSWORD, SOAK_TOKEN, SOAK_FAILURES, SOAK_PAGES_OK (a byte per page
served to a signed-in user). Only the host given to Locust
(a loopback address) is ever requested.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

from locust import HttpUser, between, events, task

_lock = threading.Lock()
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@events.request.add_listener
def _record_failure(request_type, name, response_time, response_length, response=None, exception=None, **_kw):
    status = getattr(response, "status_code", 0) or 0
    if status >= 500 or (exception is not None and status == 0):
        line = json.dumps({"at": time.time(), "path": name, "status": status,
                           "error": type(exception).__name__ if exception else None})
        with _lock, open(os.environ["SOAK_FAILURES"], "a", encoding="utf-8") as out:
            out.write(line + "\n")


class OnCall(HttpUser):
    wait_time = between(2, 5)

    def on_start(self) -> None:
        self.signed_in = False
        self._sign_in()

    def _sign_in(self) -> None:
        if time.time() < getattr(self, "retry_at", 0.0):
            return  # the console asked us to wait (429 Retry-After)
        with self.client.get("/login", name="/login", catch_response=True) as page:
            match = _CSRF.search(page.text or "")
            if not match:
                page.success()  # the console may be restarting: try again on the next page
                return
        with self.client.post("/login", name="/login (post)", allow_redirects=False, catch_response=True,
                              data={"name": os.environ["SOAK_USER"], "password": os.environ["SOAK_PASSWORD"],
                                    "csrf_token": match.group(1), "next": "/overview"}) as answer:
            self.signed_in = answer.status_code in (302, 303)
            if answer.status_code == 429:
                self.retry_at = time.time() + float(answer.headers.get("Retry-After") or 5)
            if answer.status_code < 500:
                answer.success()

    def _page(self, path: str, **headers) -> None:
        if not self.signed_in:
            self._sign_in()
            return
        with self.client.get(path, name=path, headers=headers, allow_redirects=False, catch_response=True) as answer:
            if answer.status_code in (302, 303) and "/login" in answer.headers.get("Location", ""):
                self.signed_in = False  # the session ended (a restart with a new key): sign in again
                answer.success()
            elif answer.status_code == 503:
                answer.success()  # "database unreachable" is the right answer during an outage
            elif answer.status_code == 200:
                with _lock, open(os.environ["SOAK_PAGES_OK"], "a", encoding="utf-8") as out:
                    out.write(".")  # one byte per page served to a signed-in user

    def _api(self, path: str) -> None:
        with self.client.get(path, name=path, catch_response=True,
                             headers={"Authorization": f"Bearer {os.environ['SOAK_TOKEN']}"}) as answer:
            if answer.status_code == 503:
                answer.success()

    @task(4)
    def overview(self) -> None:
        self._page("/overview")

    @task(2)
    def queues(self) -> None:
        self._page("/queues")

    @task(2)
    def deadletters(self) -> None:
        self._page("/deadletters")

    @task(2)
    def jobs(self) -> None:
        self._page("/jobs?status=failed")

    @task(1)
    def database(self) -> None:
        self._page("/health")

    @task(1)
    def alerts(self) -> None:
        self._page("/alerts")

    @task(3)
    def api_queues(self) -> None:
        self._api("/api/v1/queues")

    @task(2)
    def api_alerts(self) -> None:
        self._api("/api/v1/alerts")

    @task(1)
    def metrics(self) -> None:
        self._api("/metrics")
