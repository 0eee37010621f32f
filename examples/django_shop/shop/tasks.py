"""The shop's handlers, run by `skiplock worker --tasks shop.tasks` with DJANGO_SETTINGS_MODULE set.

Importing this module sets Django up, so the worker needs nothing else. Handlers are sync
functions (the ORM is synchronous): they run on the worker's handler threads, and each thread
keeps its own Django connection. `orm_job` closes stale connections around each job, as Django
does around each request, so a connection dropped by the server, a failover or CONN_MAX_AGE is
replaced before the next job instead of failing it.
"""

import functools
from collections.abc import Callable
from typing import Any

import django

django.setup()

from django.db import close_old_connections  # noqa: E402

import skiplock  # noqa: E402

from .models import Order  # noqa: E402


def orm_job(handler: Callable[[skiplock.Job], Any]) -> Callable[[skiplock.Job], Any]:
    """Close unusable or expired connections before the job and after it (request_started and
    request_finished do the same for a view)."""

    @functools.wraps(handler)
    def run(job: skiplock.Job) -> Any:
        close_old_connections()
        try:
            return handler(job)
        finally:
            close_old_connections()

    return run


@skiplock.task("shop.send_receipt")
@orm_job
def send_receipt(job: skiplock.Job) -> None:
    # ... send the mail, with job.side_effect_key as the provider's idempotency key ...
    Order.objects.filter(pk=job.payload["order"]).update(receipt_sent=True)
