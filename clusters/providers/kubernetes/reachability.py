"""Whether an API server answers, shared by every pass of one process.

One unanswered request (a connect or read timeout, a dropped connection)
says the server is away; asking it again at once, call after call, would
hold a pass, and the object's lock, for a timeout per call. So after one
such failure every call to that server fails at once as temporary, for a
back-off that doubles while the server stays away (5 s up to a minute);
the runner looks again after that delay, and the first call then is the
probe: an answer from the server, to any call or to an informer's list or
watch, closes the window.

Timeouts really applied: the `kubernetes` client takes `_request_timeout`
only as an int (a total) or a (connect, read) pair; a float is silently no
timeout at all. `request_timeout` always gives the pair.
"""

from __future__ import annotations

import threading
import time

from controlplane.lib.errors import TemporaryError

FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 60.0


def request_timeout(seconds: float) -> tuple[float, float]:
    """(connect, read), the only form besides an int the client applies."""
    seconds = float(seconds) if seconds and seconds > 0 else 30.0
    return (seconds, seconds)


class Reachability:
    """One API server's state: answering, or away until a time."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._mutex = threading.Lock()
        self._failures = 0
        self._away_until = 0.0
        self._why = ""
        self._since = 0.0

    def check(self, what: str) -> None:
        """Raise TemporaryError at once while the server is counted away."""
        with self._mutex:
            left = self._away_until - self._clock()
            if left <= 0:
                return
            away_for = self._clock() - self._since
            why = self._why
        raise TemporaryError(
            f"{what}: the API server has not answered for {away_for:.0f} s ({why}); "
            f"not asked again for {left:.0f} s", delay=left)

    def failed(self, why: str) -> float:
        """Count an unanswered request; the back-off before the next ask."""
        with self._mutex:
            now = self._clock()
            if self._failures == 0:
                self._since = now
            self._failures += 1
            backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self._failures - 1))
            self._away_until = now + backoff
            self._why = why[:300]
            return backoff

    def answered(self) -> None:
        with self._mutex:
            self._failures = 0
            self._away_until = 0.0
            self._why = ""

    @property
    def away(self) -> bool:
        with self._mutex:
            return self._failures > 0


_servers: dict[str, Reachability] = {}
_servers_mutex = threading.Lock()


def of(server: str) -> Reachability:
    """The shared state of the API server at `server` (its URL)."""
    with _servers_mutex:
        found = _servers.get(server)
        if found is None:
            found = _servers[server] = Reachability()
        return found
