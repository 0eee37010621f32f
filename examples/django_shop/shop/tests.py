"""The shop's tests, run by Django's own test runner on its test database:

    DATABASE_URL=postgresql://... python manage.py test shop

(tests/test_example_django.py runs exactly that against the suite's PostgreSQL). The test
database gets Skiplock's schema from the shop's migration 0002; a real `skiplock worker` runs
the handlers against it.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from django.db import connection
from django.test import TransactionTestCase

from .models import Order

HERE = Path(__file__).resolve().parent.parent  # examples/django_shop
ROOT = HERE.parent.parent  # the repository (so `skiplock` imports from a checkout too)


def jobs_for(order: int) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute("SELECT kind, queue, payload->>'order' FROM skiplock.jobs WHERE idempotency_key = %s",
                    [f"receipt-{order}"])
        return cur.fetchall()


class EnqueueInAtomic(TransactionTestCase):
    def test_an_order_and_its_receipt_job_commit_together(self):
        response = self.client.post("/orders", {"total": 42}, content_type="application/json")
        self.assertEqual(response.status_code, 201)
        order = response.json()["order"]
        self.assertTrue(Order.objects.filter(pk=order, total=42).exists())
        self.assertEqual(jobs_for(order), [("shop.send_receipt", "mail", str(order))])

    def test_a_refused_order_leaves_no_job_behind(self):
        response = self.client.post("/orders", {"total": 0}, content_type="application/json")
        self.assertEqual(response.status_code, 400)
        self.assertFalse(Order.objects.exists())
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM skiplock.jobs WHERE kind = 'shop.send_receipt'")
            self.assertEqual(cur.fetchone()[0], 0, "the job outlived the rolled-back order")


class HandlersUseTheOrm(TransactionTestCase):
    def test_a_worker_runs_the_handlers_and_holds_no_connection_between_jobs(self):
        dsn = psycopg.conninfo.make_conninfo(os.environ["DATABASE_URL"], dbname=connection.settings_dict["NAME"])
        env = {**os.environ, "DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "shop_site.settings",
               "SHOP_APPLICATION_NAME": "shop-worker", "SKIPLOCK_WORKER_POLL_INTERVAL": "0.2",
               "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        worker = subprocess.Popen([sys.executable, "-m", "skiplock", "worker", "--tasks", "shop.tasks", "--concurrency", "2"],
                                  env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            orders = [self.client.post("/orders", {"total": n}, content_type="application/json").json()["order"]
                      for n in (10, 20, 30)]
            deadline = time.monotonic() + 60
            while Order.objects.filter(pk__in=orders, receipt_sent=True).count() < 3:
                self.assertIsNone(worker.poll(), "the worker exited")
                self.assertLess(time.monotonic(), deadline, "the receipts were not sent within 60 s")
                time.sleep(0.1)
            # each job closed its thread's Django connection when it ended (CONN_MAX_AGE = 0). The
            # close comes just after the handler's commit, and a backend leaves pg_stat_activity
            # when its process ends, so this waits; a kept connection never leaves.
            deadline = time.monotonic() + 15
            while True:
                with connection.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'shop-worker'")
                    kept = cur.fetchone()[0]
                if kept == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            self.assertEqual(kept, 0, "a handler thread kept its Django connection after its job")
        finally:
            worker.terminate()
            _, err = worker.communicate(timeout=30)
        self.assertEqual(worker.returncode, 0, err)
