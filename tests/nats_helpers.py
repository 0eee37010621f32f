"""A private NATS JetStream server per test, and the processes and reads tests/test_nats_*.py use.

`nats_server` starts Debian's `nats-server -js` (scripts/bootstrap.sh --test installs it) on a
free loopback port with a store directory under the test's tmp_path, waits (with a deadline) for
it to accept connections, and kills it at teardown. Without the binary the test is skipped with
the reason, which CI=true turns into a failure (tests/conftest.py).

Every wait has a deadline; every process started here is killed at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
NATS_SERVER = shutil.which("nats-server") or ("/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None)


RUNNING: dict[str, subprocess.Popen] = {}  # the nats_server fixtures' processes by URL (stop_server)


def stop_server(nats_url: str) -> None:
    """Stop the private nats-server at `nats_url` now (a broker that went away mid-test)."""
    proc = RUNNING[nats_url]
    proc.kill()
    proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def nats_server(tmp_path):
    """The URL of a private nats-server with JetStream, killed at the test's end."""
    if NATS_SERVER is None:
        pytest.skip("nats-server is not installed (scripts/bootstrap.sh --test installs Debian's nats-server)")
    port = _free_port()
    store = tmp_path / "jetstream"
    log = open(tmp_path / "nats-server.log", "w")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen([NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"nats-server exited with {proc.returncode}: "
                                     f"{(tmp_path / 'nats-server.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("nats-server did not accept connections within 10 s") from None
                time.sleep(0.05)
        RUNNING[f"nats://127.0.0.1:{port}"] = proc
        yield f"nats://127.0.0.1:{port}"
    finally:
        RUNNING.pop(f"nats://127.0.0.1:{port}", None)
        proc.kill()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def runs_table(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.nats_runs (job_id bigint, attempt int, what text, pid int, "
                     "at timestamptz DEFAULT clock_timestamp())")
    return dsn


def set_backend(dsn: str, queue: str, backend: str = "nats") -> None:
    from console.queue import broker

    with psycopg.connect(dsn, autocommit=True) as conn:
        broker.set_backend(conn, queue, backend, actor="test", reason="exit plan test")


class Procs:
    """Relay and worker processes of one test, all killed at its end."""

    def __init__(self, dsn: str, nats_url: str, tmp_path: Path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_")}
        self.env.update(
            DATABASE_URL=dsn,
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            SKIPLOCK_BROKER_NATS_URL=nats_url,
            SKIPLOCK_BROKER_RELAY_POLL_INTERVAL="0.2",
            SKIPLOCK_WORKER_POLL_INTERVAL="0.2",
            SKIPLOCK_WORKER_SHUTDOWN_GRACE="2",
        )
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "a")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([sys.executable, "-m", "console", *args], env={**self.env, **(env or {})},
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def relay(self, name: str = "relay", **env: str) -> subprocess.Popen:
        return self.start(name, "relay", env=env)

    def worker(self, queue: str, *extra: str, name: str = "worker", **env: str) -> subprocess.Popen:
        return self.start(name, "worker", "--backend", "nats", "--queues", queue, "--tasks", "tests.nats_tasks",
                          *extra, env=env)

    def log(self, name: str) -> str:
        path = self.tmp_path / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def procs(runs_table, nats_server, tmp_path):
    p = Procs(runs_table, nats_server, tmp_path)
    yield p
    p.stop_all()


# --- reading the broker ---------------------------------------------------------------------


def _run(coro, timeout: float = 20):
    """asyncio.run in a thread of its own, within `timeout` seconds: in an xdist worker that
    already ran a Playwright (sync API) test, the main thread still has a running event loop,
    and asyncio.run refuses to start another there ("cannot be called from a running event
    loop"); every broker test failed so in a full suite, and passed alone."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(asyncio.wait_for(coro, timeout))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="nats-helper")
    thread.start()
    thread.join(timeout + 10)
    assert not thread.is_alive(), f"a NATS helper did not finish within {timeout + 10:g} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


async def _stream_messages(nats_url: str, stream: str) -> int | None:
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(nats_url)
    try:
        try:
            info = await nc.jetstream().stream_info(stream)
        except NotFoundError:
            return None
        return info.state.messages
    finally:
        await nc.close()


async def _delete_stream(nats_url: str, stream: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


def delete_stream(nats_url: str, stream: str) -> None:
    _run(_delete_stream(nats_url, stream))


async def _kill_when_stored(nats_url: str, stream: str, proc: subprocess.Popen, more_than: int, timeout: float) -> None:
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if (await js.stream_info(stream)).state.messages > more_than:
                    break
            except NotFoundError:
                pass
            await asyncio.sleep(0.002)
        else:
            raise AssertionError(f"{stream} did not grow past {more_than} messages within {timeout} s")
        proc.kill()
    finally:
        await nc.close()


def kill_when_stored(nats_url: str, stream: str, proc: subprocess.Popen, *, more_than: int, timeout: float = 20) -> None:
    """kill -9 `proc` as soon as `stream` holds more than `more_than` messages (polled every
    few milliseconds on one connection)."""
    _run(_kill_when_stored(nats_url, stream, proc, more_than, timeout), timeout + 5)


def stream_messages(nats_url: str, stream: str) -> int | None:
    """Messages stored in `stream` now (None: the stream does not exist)."""
    return _run(_stream_messages(nats_url, stream))


async def _read_all(nats_url: str, stream: str, subject: str) -> list[dict]:
    """Every message of a (limits) stream, by an ephemeral ordered read of its sequence numbers."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except NotFoundError:
                continue
            out.append({"data": json.loads(msg.data), "headers": dict(msg.headers or {})})
        return out
    finally:
        await nc.close()


def read_all(nats_url: str, stream: str, subject: str) -> list[dict]:
    return _run(_read_all(nats_url, stream, subject))


def rows(dsn: str, sql: str, params=None) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


# --- a three-node JetStream cluster on loopback -----------------------------------------------


class NatsCluster:
    """Three `nats-server -js` nodes on free loopback ports, routed to each other in one cluster
    (name "skiplock"), each with its own store directory and monitoring port. `kill(node)` is a
    kill -9; `restart(node)` starts it again on the same ports and store, so it rejoins and
    catches up its streams. Every wait has a deadline; every node is killed at teardown."""

    NAME = "skiplock"

    def __init__(self, tmp_path: Path, size: int = 3):
        if NATS_SERVER is None:
            pytest.skip("nats-server is not installed (scripts/bootstrap.sh --test installs Debian's nats-server)")
        self.tmp_path = tmp_path
        self.names = [f"n{i + 1}" for i in range(size)]
        self.ports = {n: (_free_port(), _free_port(), _free_port()) for n in self.names}  # client, route, http
        self.procs: dict[str, subprocess.Popen] = {}

    def url(self, node: str) -> str:
        return f"nats://127.0.0.1:{self.ports[node][0]}"

    @property
    def urls(self) -> str:
        """Every node's address, comma-separated: `[broker] nats_url` for a cluster."""
        return ",".join(self.url(n) for n in self.names)

    def start(self, node: str) -> None:
        client, route, http = self.ports[node]
        routes = ",".join(f"nats://127.0.0.1:{self.ports[n][1]}" for n in self.names if n != node)
        log = open(self.tmp_path / f"nats-{node}.log", "a")  # noqa: SIM115 (closed at once: the child keeps it)
        self.procs[node] = subprocess.Popen(
            [NATS_SERVER, "-js", "-n", node, "-a", "127.0.0.1", "-p", str(client), "-m", str(http),
             "-sd", str(self.tmp_path / f"js-{node}"), "--cluster_name", self.NAME,
             "--cluster", f"nats://127.0.0.1:{route}", "--routes", routes],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start_all(self, timeout: float = 20) -> str:
        """Start every node and wait for the meta leader; returns its name."""
        for node in self.names:
            self.start(node)
        return self.wait_ready(timeout=timeout)

    def monitor(self, node: str, path: str) -> dict:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[node][2]}{path}", timeout=2) as resp:
            return json.loads(resp.read())

    def meta_leader(self, node: str) -> str | None:
        """The JetStream meta leader as `node` sees it (None: none elected, or node down)."""
        try:
            meta = self.monitor(node, "/jsz").get("meta_cluster") or {}
        except OSError:
            return None
        return meta.get("leader") or None

    def wait_ready(self, nodes: list[str] | None = None, timeout: float = 20) -> str:
        """Wait until every node of `nodes` (default: the running ones) sees the same meta leader
        among the running nodes; returns its name."""
        nodes = nodes or [n for n, p in self.procs.items() if p.poll() is None]
        deadline = time.monotonic() + timeout
        while True:
            for node in nodes:
                if self.procs[node].poll() is not None:
                    raise AssertionError(f"nats-server {node} exited with {self.procs[node].returncode}: "
                                         f"{(self.tmp_path / f'nats-{node}.log').read_text()[-2000:]}")
            seen = {self.meta_leader(n) for n in nodes}
            if len(seen) == 1 and (leader := seen.pop()) in nodes:
                return leader
            if time.monotonic() > deadline:
                raise AssertionError(f"no JetStream meta leader within {timeout} s (nodes see {seen})")
            time.sleep(0.1)

    def kill(self, node: str) -> None:
        """kill -9 one node."""
        self.procs[node].kill()
        self.procs[node].wait(timeout=10)

    def restart(self, node: str, timeout: float = 20) -> None:
        """Start a killed node again (same ports, same store) and wait until it sees the leader."""
        assert self.procs[node].poll() is not None, f"{node} is still running"
        self.start(node)
        self.wait_ready(timeout=timeout)

    def client_node(self, name_prefix: str) -> str | None:
        """The node a client whose connection name starts with `name_prefix` is connected to."""
        for node, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            try:
                conns = self.monitor(node, "/connz?limit=1024").get("connections") or []
            except OSError:
                continue
            if any((c.get("name") or "").startswith(name_prefix) for c in conns):
                return node
        return None

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def nats_cluster(tmp_path):
    """A three-node JetStream cluster on loopback, not started yet (`start_all()`, or `start(node)`
    one by one to choose where clients connect first), killed at the end."""
    cluster = NatsCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


async def _stream_cluster(nats_url: str, stream: str) -> dict:
    """The replicas' view of `stream`: its leader and, per other replica, current/offline/lag."""
    import nats

    nc = await nats.connect(servers=nats_url.split(","))
    try:
        info = await nc.jetstream(timeout=5).stream_info(stream)
        cluster = info.cluster
        return {"leader": cluster.leader if cluster else None,
                "replicas": [{"name": p.name, "current": p.current, "offline": p.offline, "lag": p.lag}
                             for p in (cluster.replicas or [])] if cluster else [],
                "messages": info.state.messages, "num_replicas": info.config.num_replicas}
    finally:
        await nc.close()


def stream_cluster(nats_url: str, stream: str) -> dict:
    return _run(_stream_cluster(nats_url, stream))


async def _consumer_state(nats_url: str, stream: str, consumer: str) -> dict:
    import nats

    nc = await nats.connect(servers=nats_url.split(","))
    try:
        info = await nc.jetstream(timeout=5).consumer_info(stream, consumer)
        return {"leader": info.cluster.leader if info.cluster else None, "ack_pending": info.num_ack_pending,
                "pending": info.num_pending, "redelivered": info.num_redelivered}
    finally:
        await nc.close()


def consumer_state(nats_url: str, stream: str, consumer: str) -> dict:
    return _run(_consumer_state(nats_url, stream, consumer))


async def _move_leaders(nats_url: str, stream: str, consumer: str, to: str, timeout: float) -> tuple[str, str]:
    """Step the stream's (then the consumer's) raft leader down until `to` leads it, within
    `timeout`; returns the leaders reached (the caller checks them)."""
    import nats

    nc = await nats.connect(servers=nats_url.split(","))
    try:
        js = nc.jetstream(timeout=5)
        deadline = time.monotonic() + timeout

        async def leader_of(kind: str) -> str | None:
            with contextlib.suppress(Exception):
                info = await (js.stream_info(stream) if kind == "stream" else js.consumer_info(stream, consumer))
                return info.cluster.leader if info.cluster else None
            return None

        leaders = {}
        for kind, subject in (("stream", f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                              ("consumer", f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}")):
            while (leader := await leader_of(kind)) != to and time.monotonic() < deadline:
                if leader is not None:
                    with contextlib.suppress(Exception):
                        await nc.request(subject, b"", timeout=2)
                await asyncio.sleep(0.3)
            leaders[kind] = leader
        return leaders["stream"], leaders["consumer"]
    finally:
        await nc.close()


def move_leaders(nats_url: str, stream: str, consumer: str, to: str, timeout: float = 15) -> tuple[str, str]:
    return _run(_move_leaders(nats_url, stream, consumer, to, timeout), timeout + 10)
