"""A nats-server without JetStream (Debian's nats-server.service runs one so, from
/etc/nats-server.conf): the relay and the broker worker say what is missing instead of only
"ServiceUnavailableError: code=None" (docs/exit-plan.md, "Install").
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time

import pytest

from console.queue.broker import relay
from tests import nats_helpers
from tests.nats_helpers import _run


@pytest.fixture
def plain_nats(tmp_path):
    if nats_helpers.NATS_SERVER is None:
        pytest.skip("nats-server is not installed (scripts/bootstrap.sh --test installs Debian's nats-server)")
    port = nats_helpers._free_port()
    proc = subprocess.Popen([nats_helpers.NATS_SERVER, "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not accept connections within 10 s"
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def _streams_error(nats_url: str) -> BaseException:
    import nats

    nc = await nats.connect(nats_url)
    try:
        try:
            await relay.ensure_streams(nc.jetstream(timeout=3), "mail", 120.0)
        except Exception as exc:
            return exc
        raise AssertionError("a server without JetStream created the streams")
    finally:
        await nc.close()


def test_a_server_without_jetstream_is_named_as_such_in_the_relays_warning(plain_nats, caplog):
    exc = _run(_streams_error(plain_nats))
    assert "JetStream does not" in relay.jetstream_hint(exc) and "-js" in relay.jetstream_hint(exc)
    assert relay.jetstream_hint(TimeoutError()) == ""  # a slow broker is not a missing JetStream
    caplog.set_level(logging.WARNING, logger="skiplock.relay")
    complainer = relay.Relay.__new__(relay.Relay)  # only its warning, no database or loop
    complainer._complained = {}
    complainer._complain("mail", exc)
    assert "start nats-server with -js" in caplog.text, caplog.text
