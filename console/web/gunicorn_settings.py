"""Gunicorn's settings for the console: gunicorn.conf.py (the Procfile's `--config`) imports them.

Gunicorn has its own idea of which peers may set forwarded headers: by default it believes
`X-Forwarded-Proto`, `X-Forwarded-Ssl` and `X-Forwarded-Protocol` (the request is then HTTPS,
and production mode sends HSTS), and takes `SCRIPT_NAME`/`PATH_INFO` as header-borne overrides of
the WSGI environment, from any client at 127.0.0.1 or ::1 (`forwarded_allow_ips`). A process on
the console's machine, or a proxy that forwards headers it did not set, then decides what the
console believes, whatever `web.proxy_count` says.

So gunicorn believes no forwarded header from any peer, and the console's ProxyFix
(`console.web.create_app`) is the one place that does: the last `web.proxy_count` values of
`X-Forwarded-For`, `-Proto` and `-Host`, nothing with `proxy_count = 0`. This module reads the
Skiplock config the way the app will (the file named by `SKIPLOCK_CONFIG`, then
`SKIPLOCK_<SECTION>_<KEY>`), so a bad value stops gunicorn's master before any worker starts,
and says at start-up how many proxies are trusted.

It does not choose the bind address (gunicorn's `--bind`, or `$PORT`), the worker count or the
keep-alive (the Procfile's flags).
"""

from __future__ import annotations

from console.config import load_config

_config = load_config()
PROXY_COUNT: int = _config.web.proxy_count

# Nobody may set forwarded or scheme headers at gunicorn's level; ProxyFix applies proxy_count.
forwarded_allow_ips = ""
secure_scheme_headers: dict[str, str] = {}
forwarder_headers = ""
proxy_protocol = "off"
proxy_allow_ips = ""
# A header spelt with an underscore (X_Forwarded_Proto) is refused with 400, never mapped onto
# the same WSGI key as its dashed twin.
header_map = "refuse"


def on_starting(server) -> None:  # noqa: ANN001 - gunicorn's Arbiter
    trusted = (f"the last {PROXY_COUNT} X-Forwarded-For/-Proto/-Host value(s)" if PROXY_COUNT
               else "no X-Forwarded-* header (web.proxy_count = 0)")
    server.log.info("skiplock: gunicorn believes no forwarded header itself; the console believes %s", trusted)


__all__ = ["PROXY_COUNT", "forwarded_allow_ips", "secure_scheme_headers", "forwarder_headers", "proxy_protocol",
           "proxy_allow_ips", "header_map", "on_starting"]
