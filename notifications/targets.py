"""Where a webhook may point: http(s) URLs on public addresses only.

A webhook makes the control plane send requests wherever a team says; left
open, that reaches the cloud's metadata service, the database or the admin
on the private network (server-side request forgery). So every address a
URL's host resolves to is judged by what it is, not by a list of what it
must not be: it must be a global unicast address (IPv6: inside 2000::/3 and
globally reachable; IPv4: globally reachable, neither multicast nor
reserved), and so must any IPv4 address it carries (6to4, NAT64); an IPv4
address spelled as IPv6 (::ffff:a.b.c.d and its kin) and a literal with a
zone id (fe80::1%eth0) are refused outright. Only networks an operator let
through (REGATTA_WEBHOOK_ALLOWED_NETWORKS) pass otherwise. The
check runs when the webhook is saved and again before every try, redirects
are never followed, and each try connects to the very address it checked
(notifications/pinning.py): a DNS answer that changes between the check and
the connection (rebinding) changes nothing.

Two parsers must never disagree on the host: urlsplit reads
`http://127.0.0.1\\x.evil.example/` as the host `127.0.0.1\\x.evil.example`,
the HTTP client as 127.0.0.1. So a URL may hold only RFC 3986's characters,
and its host must be a DNS name or an IP literal.
"""

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 3986, section 2: unreserved, reserved and "%" (pct-encoded), nothing else.
_URI_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")
# A DNS name of letter-digit-hyphen labels; non-ASCII names go in xn-- form.
_DNS_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")
# Where an IPv4 address hides inside an IPv6 one: NAT64 (RFC 6052) and the
# deprecated IPv4-compatible form (::a.b.c.d). 6to4 and Teredo have their
# own accessors in ipaddress.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
# RFC 8215's local-use NAT64 prefix: IANA lists it as not globally reachable.
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
# IPv6's global unicast space (RFC 4291, 2.4; RFC 3587): everything outside
# it is multicast, link- or site-local, loopback, unspecified or reserved.
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
# Special-purpose blocks not globally reachable that IANA registered after
# the ipaddress tables of the Python this runs on: documentation (RFC 9637)
# and SRv6 segment ids (RFC 9602).
_NOT_GLOBAL_SINCE = (ipaddress.ip_network("3fff::/20"), ipaddress.ip_network("5f00::/16"))
# An IPv4 address written as IPv6: mapped (::ffff:0:0/96), SIIT-translated
# (::ffff:0:0:0/96), and the deprecated compatible form (::/96). No DNS
# answer needs them, and a socket reaches the IPv4 address behind them.
_IPV4_AS_IPV6 = (ipaddress.ip_network("::ffff:0:0/96"), ipaddress.ip_network("::ffff:0:0:0/96"),
                 _IPV4_COMPATIBLE)


class UnsafeTarget(ValueError):
    """The URL is malformed, not http(s), or resolves to a refused address."""


@dataclass(frozen=True)
class Target:
    host: str
    # What the host resolved to at the check, all allowed; a try connects to
    # the first (getaddrinfo's order, the one a plain connection would take).
    addresses: tuple[Address, ...]


def check_syntax(url: str) -> str:
    """The URL's host; raises UnsafeTarget if it is not an http(s) URL."""
    if not _URI_CHARS.fullmatch(url):
        bad = next(c for c in url if not _URI_CHARS.fullmatch(c))
        raise UnsafeTarget(
            f"The URL holds {bad!r}, which RFC 3986 does not allow; percent-encode it "
            "(a host name goes in its xn-- form).")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as exc:
        raise UnsafeTarget(f"Not a valid URL: {exc}.") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeTarget("Only http:// and https:// URLs can receive webhooks.")
    if not parts.hostname:
        raise UnsafeTarget("The URL names no host.")
    if parts.username or parts.password or "@" in parts.netloc:
        raise UnsafeTarget("Put no credentials in the URL; verify the signature instead.")
    if "%" in parts.hostname:
        raise UnsafeTarget("An address with a zone id (an interface, as in fe80::1%eth0) is "
                           "only ever a link-local one: not a webhook's.")
    if not (_ipv6_literal(parts.hostname) if parts.netloc.startswith("[")
            else _DNS_NAME.fullmatch(parts.hostname)):
        raise UnsafeTarget(f"{parts.hostname!r} is neither a DNS name nor an IP address.")
    return parts.hostname


def _ipv6_literal(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:  # an IPvFuture literal, or a zone id
        return False


def addresses(host: str) -> list[Address]:
    """Every address `host` resolves to; raises OSError if it resolves to none."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (UnicodeError, ValueError):  # a label too long, a NUL: no such host can exist
        raise UnsafeTarget(f"{host!r} is not a valid host name.") from None
    found = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    return list(dict.fromkeys(found))  # once each, in getaddrinfo's order


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 transition address carries, if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def global_unicast(address: Address) -> bool:
    """Whether `address` is one a public host may have: globally reachable
    (IANA's special-purpose registries, as ipaddress reads them), unicast,
    not reserved, and for IPv6 inside the global unicast space."""
    if address.is_multicast or address.is_unspecified or not address.is_global:
        return False
    if address.version == 6:
        return address in _GLOBAL_UNICAST_V6 and not any(address in n for n in _NOT_GLOBAL_SINCE)
    return not address.is_reserved


def refused(address: Address) -> bool:
    """True unless `address` is global unicast (and so is any IPv4 address
    inside it), or lies in a network the operator allowed."""
    inner = embedded_ipv4(address)
    allowed = settings.WEBHOOK_ALLOWED_NETWORKS
    if any(a in net for a in (address, inner) if a is not None for net in allowed
           if a.version == net.version):
        return False
    if address.version == 6 and any(address in net for net in _IPV4_AS_IPV6):
        return True
    if address in _NAT64:  # outside 2000::/3, yet public: judged by the IPv4 it carries
        return inner is None or not global_unicast(inner)
    if not global_unicast(address):
        return True
    return inner is not None and not global_unicast(inner)


def resolve(url: str) -> Target:
    """The checked target of `url`; raises UnsafeTarget unless it may receive
    webhooks, and OSError if its host does not resolve (now: DNS may be back
    later)."""
    host = check_syntax(url)
    found = addresses(host)
    bad = sorted({str(a) for a in found if refused(a)})
    if bad:
        raise UnsafeTarget(
            f"{host} resolves to {', '.join(bad)}, which is not a public address; an "
            "operator can allow its network with REGATTA_WEBHOOK_ALLOWED_NETWORKS.")
    return Target(host, tuple(found))


def check(url: str) -> None:
    """resolve(), for callers that only want the verdict."""
    resolve(url)
