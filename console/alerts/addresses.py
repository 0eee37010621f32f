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
fd00:ec2::254, 100.100.100.200, 192.0.0.192), the names `localhost` and `*.localhost` (RFC 6761),
the local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215), and IPv6 addresses that embed a refused
IPv4 one. Set `alerts.allow_private_destinations = true` for a receiver on your own network (and
for the demo and tests, whose receiver is on loopback).

**The host is normalised before the policy** (`normalise_host`), at save time and at send time
alike, because the same address has many spellings and a policy that reads only one is a policy
with holes: trailing dots (`localhost.`, an absolute name), IDNA mapping (fullwidth digits and
ideographic full stops become `127.0.0.1`), an IPv6 zone id (`[fe80::1%25lo]`), the legacy IPv4
forms the C resolver accepts (`127.1`, `0x7f.1`, `2130706433`, `0177.0.0.1`), and every IPv6 form
that carries an IPv4 address (`embedded_ipv4`): mapped `::ffff:a.b.c.d`, translated
`::ffff:0:a.b.c.d`, compatible `::a.b.c.d`, NAT64 well-known `64:ff9b::/96` and local-use
`64:ff9b:1::/48` (every RFC 6052 position), 6to4 `2002::/16` and Teredo `2001::/32` (server and
client). A literal address is checked without a DNS query; a percent sign outside a zone id is
refused (some clients decode `%31%32%37.0.0.1`, ours would not, and no real host needs one).

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
# IPv6 ranges whose addresses carry an IPv4 address (RFC 4291, 6052, 8215, 3056, 4380, 2765).
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
# RFC 6052 section 2.2: where a /N translation prefix puts the IPv4 address, as (bit offset,
# width) pieces of the 128-bit address; bits 64-71 (the "u" octet) are always skipped. A
# local-use prefix may be any of /48 to /96 inside 64:ff9b:1::/48, so each is tried.
_RFC6052_PIECES = {
    96: ((96, 32),),
    64: ((72, 32),),
    56: ((56, 8), (72, 24)),
    48: ((48, 16), (72, 16)),
}
_LOCAL_NAMES = ("localhost",)  # RFC 6761: localhost and every name under it is loopback
_LEGACY_IPV4 = frozenset("0123456789abcdefx.")


class AddressRefused(ValueError):
    """A destination's host is (or resolves to) an address the policy refuses."""

    def __init__(self, host: str, address: str, reason: str):
        self.host, self.address, self.reason = host, address, reason
        shown = f"{host} resolves to {address}" if host != address else address
        super().__init__(f"{shown} ({reason} address), which is refused: set {SETTING} = true to "
                         "allow destinations on private networks" if host != address else
                         f"{shown} is a {reason} address, which is refused: set {SETTING} = true to "
                         "allow destinations on private networks")


def _bits(ip: ipaddress.IPv6Address, pieces: tuple[tuple[int, int], ...]) -> ipaddress.IPv4Address:
    value = 0
    for offset, width in pieces:
        value = (value << width) | ((int(ip) >> (128 - offset - width)) & ((1 << width) - 1))
    return ipaddress.IPv4Address(value)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address `ip` carries, in each form that routes to it (empty for a plain IPv6
    address). :: and ::1 are themselves, not compatible forms of 0.0.0.0 and 0.0.0.1."""
    if ip in _MAPPED or ip in _TRANSLATED or ip in _NAT64:
        return [_bits(ip, _RFC6052_PIECES[96])]
    if ip in _COMPATIBLE:
        return [] if int(ip) <= 1 else [_bits(ip, _RFC6052_PIECES[96])]
    if ip in _NAT64_LOCAL:  # a reading that starts with zeros is the padding, not an address
        found = [_bits(ip, pieces) for pieces in _RFC6052_PIECES.values()]
        return [inner for inner in found if int(inner) >> 24]
    if ip in _SIXTOFOUR:
        return [ip.sixtofour] if ip.sixtofour is not None else []
    if ip in _TEREDO and ip.teredo is not None:
        return list(ip.teredo)  # the Teredo server, and the client (un-obfuscated)
    return []


def refusal(address: str | Address) -> str | None:
    """Why the policy refuses `address` (an IP address, any spelling `normalise_host` reads),
    or None when it is a public address."""
    ip = address if isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address) else _literal(address)
    if ip is None:
        raise ValueError(f"{address!r} is not an IP address")
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ipaddress.IPv6Address(int(ip))  # without its zone id
        for inner in embedded_ipv4(ip):
            reason = refusal(inner)
            if reason:
                return reason
        if ip in _NAT64_LOCAL:
            return "local-use NAT64 (RFC 8215)"
    for network, reason in _REFUSED:
        if ip.version == network.version and ip in network:
            return reason
    return None


def _literal(host: str) -> Address | None:
    """`host` as an IP address if it is one in any spelling a resolver accepts, else None."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.replace("%25", "%", 1))
        except ValueError:
            return None
    if host and set(host) <= _LEGACY_IPV4 and host[0].isdigit():
        try:  # the C library's inet_aton: 127.1, 0x7f.0.0.1, 2130706433, 0177.0.0.1
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def normalise_host(host: str) -> str | Address:
    """The host as the policy reads it: an IP address when it is a literal (zone id dropped,
    legacy IPv4 forms read), else the name in lower-case ASCII without trailing dots. Raises
    AddressRefused for a host no honest URL has (a percent sign outside a zone id)."""
    raw = host.strip("[]")
    if ":" in raw:
        ip = _literal(raw)
        if ip is None:
            raise AddressRefused(host, host, "malformed IPv6")
        return ip
    try:
        name = raw.encode("idna").decode("ascii").lower() if not raw.isascii() else raw.lower()
    except UnicodeError:
        name = raw.lower()
    name = name.rstrip(".")
    if "%" in name:
        raise AddressRefused(host, host, "percent-encoded host (not a host name)")
    return _literal(name) or name


def _name_refusal(name: str) -> str | None:
    if any(name == local or name.endswith("." + local) for local in _LOCAL_NAMES):
        return "loopback (a localhost name)"
    return None


def resolve(host: str, port: int, *, allow_private: bool) -> list[tuple[int, tuple]]:
    """Every (family, sockaddr) `host` resolves to, each one checked against the policy; the
    caller connects to these, never to the name again. The host is normalised first, so a
    literal address in any spelling is checked (and connected to) without a DNS query. Raises
    AddressRefused when any address is refused (one bad answer among good ones is still an
    attempt to reach inside), and socket.gaierror when the name does not resolve."""
    target = normalise_host(host)
    if not isinstance(target, str):
        if not allow_private:
            reason = refusal(target)
            if reason:
                raise AddressRefused(host, str(target), reason)
        if isinstance(target, ipaddress.IPv4Address):
            return [(socket.AF_INET, (str(target), port))]
        scope = socket.if_nametoindex(target.scope_id) if target.scope_id and not target.scope_id.isdigit() else \
            int(target.scope_id or 0)
        return [(socket.AF_INET6, (str(ipaddress.IPv6Address(int(target))), port, 0, scope))]
    if not allow_private:
        reason = _name_refusal(target)
        if reason:
            raise AddressRefused(host, host, reason)
    infos = socket.getaddrinfo(target, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
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
