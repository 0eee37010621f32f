"""Settings of the example shop: one PostgreSQL database, given as DATABASE_URL (the same
variable `skiplock worker` reads), on Django's psycopg 3 backend."""

import os

import psycopg

_db = psycopg.conninfo.conninfo_to_dict(os.environ["DATABASE_URL"])  # a URL or key=value pairs

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["shop"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "shop_site.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "postgres"),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        # Which process a connection belongs to, in pg_stat_activity (the worker sets its own).
        "OPTIONS": {"application_name": os.environ.get("SHOP_APPLICATION_NAME", "shop")},
        # 0 (Django's default): a connection lives for one request, or one job in a worker
        # (shop.tasks closes it after each). A longer CONN_MAX_AGE works too, with health checks.
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
    }
}
