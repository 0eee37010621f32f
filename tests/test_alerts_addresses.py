"""The webhook address policy (alerts.allow_private_destinations) at save time and at send time,
and one deadline per delivery, against real local receivers (loopback) and a trickling server."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from console.alerts import addresses, outbox
from console.alerts import evaluate as ev
from console.alerts import rules as r
from console.alerts.rules import RuleError, parse_destination
from console.alerts.transports import PermanentError, transport_for
from console.config import load_config
from tests.alert_receiver import Receiver
from tests.web_fixtures import CSRF

REFUSED = {
    "127.0.0.1": "loopback", "127.8.9.10": "loopback", "::1": "loopback", "10.1.2.3": "private (RFC 1918)",
    "172.16.0.1": "private (RFC 1918)", "172.31.255.255": "private (RFC 1918)", "192.168.1.1": "private (RFC 1918)",
    "fd12:3456::1": "private (IPv6 unique local)", "100.64.0.1": "carrier-grade NAT (RFC 6598)",
    "169.254.169.254": "cloud metadata", "fd00:ec2::254": "cloud metadata", "169.254.1.1": "link-local",
    "fe80::1": "link-local", "0.0.0.0": "unspecified (this network)", "::": "unspecified", "224.0.0.1": "multicast",
    "ff02::1": "multicast", "255.255.255.255": "reserved", "::ffff:10.0.0.1": "private (RFC 1918)",
    "::ffff:127.0.0.1": "loopback", "64:ff9b::a9fe:a9fe": "cloud metadata",
}
PUBLIC = ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700::1111", "::ffff:8.8.8.8"]


def test_refused_ranges():
    for address, reason in REFUSED.items():
        assert addresses.refusal(address) == reason, address
    for address in PUBLIC:
        assert addresses.refusal(address) is None, address



# Issue 26, class 5: every spelling of an inside address, each refused when saved and when sent.
# The first four were accepted at save time before the host was normalised.
FORMS = {
    "http://[::127.0.0.1]/": "loopback",  # IPv4-compatible
    "http://[64:ff9b:1::a9fe:a9fe]/latest": "cloud metadata",  # local-use NAT64, /96 position
    "http://[fe80::1%25lo]/": "link-local",  # zone id
    "http://localhost./": "loopback",  # trailing dot
    "http://localhost../": "loopback",
    "http://LOCALHOST/": "loopback",
    "http://admin.localhost/": "loopback",  # RFC 6761: every name under localhost
    "http://127.0.0.1./": "loopback",
    "http://[::7f00:1]/": "loopback",
    "http://[0:0:0:0:0:0:a9fe:a9fe]/": "cloud metadata",
    "http://[::10.0.0.1]/": "private (RFC 1918)",
    "http://[::ffff:0:7f00:1]/": "loopback",  # IPv4-translated (SIIT)
    "http://[::FFFF:7F00:1]/": "loopback",
    "http://[0:0:0:0:0:ffff:a9fe:a9fe]/": "cloud metadata",
    "http://[64:ff9b::127.0.0.1]/": "loopback",
    "http://[64:ff9b::c0a8:101]/": "private (RFC 1918)",
    "http://[64:ff9b:1:a:c8:1::]/": "private (RFC 1918)",  # local-use, /56 position (10.200.0.1)
    "http://[64:ff9b:1:7f00:0:100::]/": "loopback",  # local-use, /48 position (127.0.0.1)
    "http://[64:ff9b:1::808:808]/": "local-use NAT64 (RFC 8215)",  # local use whatever it wraps
    "http://[2002:7f00:1::]/": "loopback",  # 6to4
    "http://[2002:a9fe:a9fe::1]/": "cloud metadata",
    "http://[2002:c0a8:101:1::1]/": "private (RFC 1918)",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/": "loopback",  # Teredo, client 127.0.0.1
    "http://[2001:0:a00:1:8000:63bf:f7f7:f7f7]/": "private (RFC 1918)",  # Teredo server 10.0.0.1
    "http://[2001:0:4136:e378:8000:63bf:5601:5601]/": "cloud metadata",  # client 169.254.169.254
    "http://[fe80::1%25eth0]:8080/": "link-local",
    "http://[fd00:ec2::254%25eth0]/": "cloud metadata",
    "http://[::ffff:127.0.0.1%25lo]/": "loopback",
    "http://2130706433/": "loopback",  # legacy IPv4 spellings the C resolver accepts
    "http://0x7f000001/": "loopback",
    "http://0177.0.0.1/": "loopback",
    "http://0x7f.0.0.1/": "loopback",
    "http://127.1/": "loopback",
    "http://0/": "unspecified (this network)",
    "http://10.1/": "private (RFC 1918)",
    "http://169.254.43518/": "cloud metadata",
    "http://0xa9fea9fe/": "cloud metadata",
    "http://0251.0376.0251.0376/": "cloud metadata",
    "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/": "loopback",  # fullwidth digits (IDNA maps them)
    "http://127\u30020\u30020\u30021/": "loopback",  # ideographic full stops
    "http://%31%32%37.0.0.1/": "percent-encoded host (not a host name)",
    "http://hooks.example.com@127.0.0.1/": "loopback",  # the host is after the @
    "http://metadata.test./computeMetadata": "cloud metadata",  # a name, with its trailing dot
    "https://inside.test./": "private (RFC 1918)",
}
# Public, in unusual spellings: still allowed (the normalisation must not over-refuse).
PUBLIC_FORMS = {
    "http://[64:ff9b::808:808]/": ("8.8.8.8", "64:ff9b::808:808"),
    "http://[2002:808:808::1]/": ("2002:808:808::1",),
    "http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/": ("2001:0:4136:e378:8000:63bf:f7f7:f7f7",),
    "http://134744072/": ("8.8.8.8",),
    "http://public.test./": ("93.184.216.34",),
}


def test_every_spelling_of_an_inside_address_is_refused_when_saved_and_when_sent(conn, fake_dns):
    fake_dns.update({"metadata.test": ["169.254.169.254"], "inside.test": ["10.9.8.7"]})
    config = load_config(env={})
    wrong = []  # (url, where, what happened): every form is tried, so a failure lists them all
    for url, reason in FORMS.items():
        try:
            r.save_destination(conn, {"name": "ops", "url": url}, actor="alice", config=config)
            wrong.append((url, "save", "accepted"))
        except RuleError as exc:
            if reason not in str(exc) or "webhook 'ops'" not in str(exc):
                wrong.append((url, "save", str(exc)))
        dest = parse_destination({"name": "ops", "url": url})  # as if saved before this rule
        try:
            transport_for(dest, timeout=1).send({"idempotency_key": "k", "event": "test"})
            wrong.append((url, "send", "sent"))
        except PermanentError as exc:
            if "refused" not in str(exc) or reason not in str(exc):
                wrong.append((url, "send", str(exc)))
        except Exception as exc:  # a connection attempt (refused, timed out): the policy let it through
            wrong.append((url, "send", f"connected ({type(exc).__name__})"))
    assert wrong == [], "\n".join(f"{w[1]} {w[0]}: {w[2]}" for w in wrong)
    assert r.db_destinations(conn) == {}


def test_public_addresses_in_unusual_spellings_pass_and_are_connected_to_as_checked(conn, fake_dns):
    fake_dns["public.test"] = ["93.184.216.34"]
    config = load_config(env={})
    for index, (url, expected) in enumerate(PUBLIC_FORMS.items()):
        r.save_destination(conn, {"name": f"pub{index}", "url": url}, actor="alice", config=config)
        host = addresses.urlsplit(url).hostname
        [(_family, sockaddr)] = addresses.resolve(host, 80, allow_private=False)
        assert sockaddr[0] in expected, (url, sockaddr)
    assert len(r.db_destinations(conn)) == len(PUBLIC_FORMS)


def test_the_normalised_host():
    assert addresses.normalise_host("LocalHost..") == "localhost"
    assert addresses.normalise_host("Hooks.Example.COM.") == "hooks.example.com"
    assert str(addresses.normalise_host("fe80::1%25lo")) == "fe80::1%lo"
    assert str(addresses.normalise_host("0x7f.1")) == "127.0.0.1"
    assert str(addresses.normalise_host("\uff11\uff12\uff17.\uff10.\uff10.\uff11")) == "127.0.0.1"
    assert addresses.normalise_host("deadbeef") == "deadbeef"  # a name of hex letters stays a name
    assert addresses.normalise_host("123.abc") == "123.abc"
    assert [str(a) for a in addresses.embedded_ipv4(addresses.ipaddress.IPv6Address("2001:0:4136:e378:8000:63bf:3fff:fdd2"))] == \
        ["65.54.227.120", "192.0.2.45"]  # RFC 4380's example: server, then the client un-obfuscated
    assert addresses.embedded_ipv4(addresses.ipaddress.IPv6Address("::1")) == []
    assert addresses.embedded_ipv4(addresses.ipaddress.IPv6Address("2606:4700::1111")) == []

@pytest.fixture
def fake_dns(monkeypatch):
    """Names under .test resolve to what the test says (the outer edge: the system resolver)."""
    table: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".test"):
            if host not in table:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                     (a, port) if ":" not in a else (a, port, 0, 0)) for a in table[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def _outbox_row(conn, destination: str) -> None:
    outbox.enqueue(conn, alert_id=None, event_id=None, destinations=[destination],
                   notification={"idempotency_key": f"k-{time.time_ns()}", "event": "firing", "alert": {}})


def test_send_refuses_a_loopback_receiver_unless_allowed(conn):
    with Receiver() as receiver:
        dest = parse_destination({"name": "inside", "url": receiver.url})
        _outbox_row(conn, "inside")
        report = outbox.Sender(conn, lambda: {"inside": dest}, ev.AlertSettings()).run_once()
        assert report.failed == 1 and receiver.requests == []
        error = conn.execute("SELECT error FROM skiplock.alert_deliveries").fetchone()[0]
        assert "'inside'" in error and "127.0.0.1" in error and "loopback" in error
        assert "alerts.allow_private_destinations" in error
        # the same destination with the setting on is delivered
        _outbox_row(conn, "inside")
        allowed = outbox.Sender(conn, lambda: {"inside": dest}, ev.AlertSettings(allow_private_destinations=True))
        assert allowed.run_once().delivered == 1 and len(receiver.requests) == 1
        test = outbox.send_test(None, dest, timeout=2)
        assert not test.ok and "loopback" in test.message and len(receiver.requests) == 1


def test_send_checks_every_address_at_send_time_and_connects_to_the_checked_one(conn, fake_dns):
    with Receiver() as receiver:
        port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
        # Saved while the name pointed outside (save-time check passes) ...
        fake_dns["hooks.rebind.test"] = ["93.184.216.34"]
        config = load_config(env={})
        dest = r.save_destination(conn, {"name": "rebind", "url": f"http://hooks.rebind.test:{port}/hook"},
                                  actor="alice", config=config)
        # ... then DNS answers loopback (rebinding), or a public address with a private one beside it
        for answer in (["127.0.0.1"], ["93.184.216.34", "10.0.0.7"]):
            fake_dns["hooks.rebind.test"] = answer
            with pytest.raises(PermanentError, match="refused"):
                transport_for(dest, timeout=2).send({"idempotency_key": "k", "event": "test"})
        assert receiver.requests == []
        # Allowed: the connection goes to the address that was checked (the name itself is not
        # resolvable by the system), with the name in the Host header.
        fake_dns["hooks.rebind.test"] = ["127.0.0.1"]
        sent = transport_for(dest, timeout=2, allow_private=True).send({"idempotency_key": "k", "event": "test"})
        assert sent.status == 200
        assert receiver.requests[0]["headers"]["Host"] == f"hooks.rebind.test:{port}"


def test_saving_a_refused_destination_names_it_and_the_address(conn, fake_dns):
    config = load_config(env={})
    fake_dns["metadata.test"] = ["169.254.169.254"]
    for url, address in (("http://127.0.0.1:9/x", "127.0.0.1"), ("http://[::1]:9/x", "::1"),
                         ("http://metadata.test/latest", "169.254.169.254"), ("https://10.0.0.5/hook", "10.0.0.5")):
        with pytest.raises(RuleError) as caught:
            r.save_destination(conn, {"name": "ops", "url": url}, actor="alice", config=config)
        assert "webhook 'ops'" in str(caught.value) and address in str(caught.value), url
    assert r.db_destinations(conn) == {}
    allowing = load_config(env={}, overrides={"alerts.allow_private_destinations": True})
    assert r.save_destination(conn, {"name": "ops", "url": "http://127.0.0.1:9/x"}, actor="alice", config=allowing)
    # a name that does not resolve now is accepted: the send-time check stays
    assert r.save_destination(conn, {"name": "later", "url": "https://nowhere.test/x"}, actor="alice", config=config)


def test_the_ui_api_and_config_file_refuse_private_destinations(client_as, dsn, tmp_path):
    from console.web import create_app

    admin = client_as("admin")
    resp = admin.post("/api/v1/alerts/destinations", json={"name": "ops", "url": "http://192.168.0.10/hook", "reason": "ops hook"},
                      headers={"X-CSRF-Token": CSRF})
    assert resp.status_code == 400
    assert "webhook 'ops'" in resp.get_json()["error"] and "192.168.0.10" in resp.get_json()["error"]
    page = admin.post("/alerts/destinations", data={"csrf_token": CSRF, "name": "ops", "url": "http://169.254.169.254/",
                                                     "reason": "ops hook"})
    assert page.status_code == 400 and b"169.254.169.254" in page.data
    path = tmp_path / "skiplock.toml"
    path.write_text('[[webhooks]]\nname = "inside"\nurl = "http://127.0.0.1:8080/hook"\n')
    config = load_config(path, env={}, overrides={"database.dsn": dsn, "web.secret_key": "k"})
    with pytest.raises(RuleError, match=r"webhook 'inside' \(in the config file\): 127.0.0.1 is a loopback"):
        create_app(config)


class Trickler:
    """A real local server that reads the request, then answers one byte every `every` seconds."""

    def __init__(self, every: float = 0.2):
        self.every = every
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def _serve(self) -> None:
        self.sock.settimeout(10)
        try:
            client, _ = self.sock.accept()
        except OSError:
            return
        with client:
            client.settimeout(5)
            try:
                client.recv(65536)
                answer = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"z" * 200 + b"\r\nContent-Length: 2\r\n\r\nok"
                for byte in answer:
                    if self.stop.wait(self.every):
                        return
                    client.sendall(bytes([byte]))
                    self.sent += 1
            except OSError:
                return  # the sender hung up: what we want

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()
        self.thread.join(5)


def test_a_trickling_receiver_cannot_hold_the_sender_past_the_deadline(conn):
    settings = ev.AlertSettings(delivery_timeout=1.0, allow_private_destinations=True)
    with Trickler(every=0.2) as slow:
        dest = parse_destination({"name": "slow", "url": slow.url})
        _outbox_row(conn, "slow")
        started = time.monotonic()
        report = outbox.Sender(conn, lambda: {"slow": dest}, settings).run_once()
        took = time.monotonic() - started
        assert slow.sent >= 2  # it did answer, a byte at a time, within each read's patience
    assert took < 4.0, f"the delivery took {took:.1f}s with a 1s deadline"
    assert report.retried == 1
    outcome, error, duration = conn.execute(
        "SELECT outcome, error, duration_ms FROM skiplock.alert_deliveries").fetchone()
    assert outcome == "retry" and "timed out after 1s" in error
    assert duration < 3000
