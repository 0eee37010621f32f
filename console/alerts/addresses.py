"""The address policy of webhook destinations: where Skiplock may post, checked twice.

A webhook URL is typed by an operator (UI, API, config file) and the console posts to it from
inside the network, so without a policy a destination could reach the cloud metadata service,
the database, or an admin port on localhost (SSRF). With `alerts.allow_private_destinations =
false` (the default) every address a host name resolves to must be a public one:

- **at save time** (`check_destination`, called when the UI/API saves a destination and when
  the config file's `[[webhooks]]` are checked at start-up) the host is resolved and a refused
  address stops the save with a message naming the destination and the address; a name that
  does not resolve now is accepted (it is checked again at send time);
- **at send time** (`resolve`, called by the transport for every delivery) the host is resolved
  again, *every* address is checked, and the transport connects to one of the checked addresses
  itself: a DNS answer that changed since the save (DNS rebinding) is refused there.

Refused: loopback, link-local, private (RFC 1918, IPv6 ULA), carrier-grade NAT, unspecified,
multicast, broadcast and reserved ranges, the cloud metadata addresses (169.254.169.254,
fd00:ec2::254, 100.100.100.200, 192.0.0.192), and IPv6 addresses that embed a refused IPv4 one
(::ffff:10.0.0.1, 64:ff9b::/96, 2002::/16). Set `alerts.allow_private_destinations = true` for a
receiver on your own network (and for the demo and tests, whose receiver is on loopback).

This module does not send anything and keeps no state; DNS resolution is the system resolver's.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

SETTING = "alerts.allow_private_destinations"

# Checked in order: the most specific reason first.
_METADATA = [ipaddress.ip_network(n) for n in ("169.254.169.254/32", "fd00:ec2::254/128", "100.100.100.200/32",
                                                "192.0.0.192/32")]
_REFUSED: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = [
    *((net, "cloud metadata") for net in _METADATA),
    (ipaddress.ip_network("0.0.0.0/8"), "unspecified (this network)"),
    (ipaddress.ip_network("127.0.0.0/8"), "loopback"),
    (ipaddress.ip_network("10.0.0.0/8"), "private (RFC 1918)"),
    (ipaddress.ip_network("172.16.0.0/12"), "private (RFC 1918)"),
    (ipaddress.ip_network("192.168.0.0/16"), "private (RFC 1918)"),
    (ipaddress.ip_network("100.64.0.0/10"), "carrier-grade NAT (RFC 6598)"),
    (ipaddress.ip_network("169.254.0.0/16"), "link-local"),
    (ipaddress.ip_network("192.0.0.0/24"), "IETF protocol assignments"),
    (ipaddress.ip_network("198.18.0.0/15"), "benchmarking (RFC 2544)"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("240.0.0.0/4"), "reserved"),  # includes 255.255.255.255 (broadcast)
    (ipaddress.ip_network("::/128"), "unspecified"),
    (ipaddress.ip_network("::1/128"), "loopback"),
    (ipaddress.ip_network("fc00::/7"), "private (IPv6 unique local)"),
    (ipaddress.ip_network("fe80::/10"), "link-local"),
    (ipaddress.ip_network("fec0::/10"), "site-local"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class AddressRefused(ValueError):
    """A destination's host is (or resolves to) an address the policy refuses."""

    def __init__(self, host: str, address: str, reason: str):
        self.host, self.address, self.reason = host, address, reason
        shown = f"{host} resolves to {address}" if host != address else address
        super().__init__(f"{shown} ({reason} address), which is refused: set {SETTING} = true to "
                         "allow destinations on private networks" if host != address else
                         f"{shown} is a {reason} address, which is refused: set {SETTING} = true to "
                         "allow destinations on private networks")


def refusal(address: str | Address) -> str | None:
    """Why the policy refuses `address`, or None when it is a public address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = refusal(embedded)
            if inner:
                return inner
    for network, reason in _REFUSED:
        if ip.version == network.version and ip in network:
            return reason
    return None


def resolve(host: str, port: int, *, allow_private: bool) -> list[tuple[int, tuple]]:
    """Every (family, sockaddr) `host` resolves to, each one checked against the policy; the
    caller connects to these, never to the name again. Raises AddressRefused when any address
    is refused (one bad answer among good ones is still an attempt to reach inside), and
    socket.gaierror when the name does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[tuple[int, tuple]] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if not allow_private:
            reason = refusal(sockaddr[0])
            if reason:
                raise AddressRefused(host, sockaddr[0], reason)
        if (family, sockaddr) not in found:
            found.append((family, sockaddr))
    if not found:
        raise socket.gaierror(socket.EAI_NONAME, f"{host} has no IPv4 or IPv6 address")
    return found


def check_url(url: str, *, allow_private: bool) -> None:
    """The save-time check of one URL: AddressRefused when its host is, or resolves to, a refused
    address. A name that does not resolve now passes (the send-time check stays)."""
    if allow_private:
        return
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        resolve(host, parts.port or (443 if parts.scheme == "https" else 80), allow_private=False)
    except (socket.gaierror, UnicodeError):
        return


def allowed_private(config) -> bool:
    """The setting from a Config (False when there is none: the safe side)."""
    return bool(getattr(getattr(config, "alerts", None), "allow_private_destinations", False))
