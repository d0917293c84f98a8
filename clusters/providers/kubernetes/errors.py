"""Kubernetes API errors sorted into the three classes reconcilers act on.

429 and 5xx, timeouts and dropped connections are worth a retry after a
delay (the server's Retry-After when it sends one); 400, 403 and 422 will
fail the same way again. Anything else (401 from an expiring token, 404 on a
read) is re-raised unchanged for the caller to judge.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from controlplane.lib.errors import PermanentError, TemporaryError

TEMPORARY_STATUSES = frozenset({429, 500, 502, 503, 504})
PERMANENT_STATUSES = frozenset({400, 403, 422})
DEFAULT_DELAY_S = 5.0
NETWORK_ERRORS = (
    urllib3.exceptions.HTTPError,  # MaxRetryError, ProtocolError, ReadTimeoutError, ...
    ConnectionError,
    TimeoutError,
    socket.timeout,
)


def retry_after(exc: ApiException, default: float = DEFAULT_DELAY_S) -> float:
    headers = exc.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else default
    except (TypeError, ValueError):
        return default


def classify(exc: BaseException, what: str) -> BaseException:
    """The error to raise for `exc`, which happened while doing `what`."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        detail = f"{what}: HTTP {status} {exc.reason or ''}".strip()
        # 0: no status at all, the client's word for a TLS handshake that failed.
        if status in TEMPORARY_STATUSES or status >= 500 or status == 0:
            return TemporaryError(detail, delay=retry_after(exc))
        if status in PERMANENT_STATUSES:
            return PermanentError(f"{detail}: {_message(exc)}")
        return exc
    if isinstance(exc, NETWORK_ERRORS):
        return TemporaryError(f"{what}: {type(exc).__name__}: {exc}", delay=DEFAULT_DELAY_S)
    return exc


@contextlib.contextmanager
def classified(what: str) -> Iterator[None]:
    """Re-raise what the block raises in its class."""
    try:
        yield
    except (ApiException, *NETWORK_ERRORS) as exc:
        mapped = classify(exc, what)
        if mapped is exc:
            raise
        raise mapped from exc


def unanswered(exc: BaseException) -> bool:
    """The server did not answer at all (a timeout, a refused or dropped
    connection, a TLS handshake that never finished): nothing it said."""
    if isinstance(exc, ApiException):
        # The client reports a failed TLS handshake as an ApiException of status 0.
        return not exc.status
    return isinstance(exc, NETWORK_ERRORS)


def is_status(exc: BaseException, status: int) -> bool:
    return isinstance(exc, ApiException) and exc.status == status


def _message(exc: ApiException) -> str:
    # The API server explains itself in a Status object's "message".
    try:
        return json.loads(exc.body or "{}").get("message", "") or (exc.body or "")[:300]
    except (ValueError, AttributeError):
        return str(exc.body or "")[:300]
