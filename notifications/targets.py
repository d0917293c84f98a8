"""Where a webhook may point: http(s) URLs on public addresses only.

A webhook makes the control plane send requests wherever a team says; left
open, that reaches the cloud's metadata service, the database or the admin
on the private network (server-side request forgery). So every address a
URL's host resolves to must be global, unless it lies in one of the
networks an operator let through (REGATTA_WEBHOOK_ALLOWED_NETWORKS). The
check runs when the webhook is saved and again before every try, and
redirects are never followed. Known limit: a host whose DNS answer changes
between the check and the connection (rebinding) is not caught.
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings


class UnsafeTarget(ValueError):
    """The URL is malformed, not http(s), or resolves to a refused address."""


def check_syntax(url: str) -> str:
    """The URL's host; raises UnsafeTarget if it is not an http(s) URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as exc:
        raise UnsafeTarget(f"Not a valid URL: {exc}.") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeTarget("Only http:// and https:// URLs can receive webhooks.")
    if not parts.hostname:
        raise UnsafeTarget("The URL names no host.")
    if parts.username or parts.password:
        raise UnsafeTarget("Put no credentials in the URL; verify the signature instead.")
    return parts.hostname


def addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address `host` resolves to; raises OSError if it resolves to none."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (UnicodeError, ValueError):  # a label too long, a NUL: no such host can exist
        raise UnsafeTarget(f"{host!r} is not a valid host name.") from None
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def refused(address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if any(address in net for net in settings.WEBHOOK_ALLOWED_NETWORKS):
        return False
    return not address.is_global


def check(url: str) -> None:
    """Raises UnsafeTarget unless `url` may receive webhooks, and OSError if
    its host does not resolve (now: DNS may be back later)."""
    host = check_syntax(url)
    bad = sorted({str(a) for a in addresses(host) if refused(a)})
    if bad:
        raise UnsafeTarget(
            f"{host} resolves to {', '.join(bad)}, which is not a public address; an "
            "operator can allow its network with REGATTA_WEBHOOK_ALLOWED_NETWORKS.")
