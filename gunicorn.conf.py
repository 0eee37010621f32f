# Gunicorn's settings for the console (the Procfile's web line uses this file): gunicorn trusts
# no forwarded header itself; the console applies web.proxy_count. Why, and what is set:
# console/web/gunicorn_settings.py.
from console.web.gunicorn_settings import *  # noqa: F403
