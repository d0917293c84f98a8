"""Signing deliveries the Standard Webhooks way (standardwebhooks.com).

Each request carries three headers:

    webhook-id:        msg_<delivery id>, the same on every retry
    webhook-timestamp: seconds since the epoch when this try was sent
    webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">

keyed with the webhook's secret (`whsec_<base64>`: the key is the decoded
bytes). A receiver recomputes the HMAC over the raw body it got, compares in
constant time, and refuses a timestamp far from its clock (replays); any
Standard Webhooks library does all three (docs/notifications.md).
"""

import base64
import hashlib
import hmac

from .models import SECRET_PREFIX


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets: list[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """One signature per secret, space-separated: during a rotation the
    receiver may hold either the old secret or the new one."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets),
    }


def verify(secret: str, headers: dict[str, str], body: bytes, *, now: float,
           tolerance_s: float = 300) -> bool:
    """The receiver's side, as docs/notifications.md gives it."""
    got = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp = got.get("webhook-id", ""), got.get("webhook-timestamp", "")
    if not (msg_id and stamp.isdigit()) or abs(now - int(stamp)) > tolerance_s:
        return False
    expected = signature(secret, msg_id, int(stamp), body)
    return any(hmac.compare_digest(expected, sent)
               for sent in got.get("webhook-signature", "").split())
