"""Per-object Redis locks around reconcile passes.

A lock is `SET key token NX PX ttl`; release deletes it only if it still holds
our token (a Lua compare-and-delete), so a pass that outlived its TTL never
frees a lock that another worker took since. The TTL is what keeps a worker
killed mid-pass from wedging the object: after it, the next sweep gets in.

A pass may run longer than the TTL (a preflight check alone may take minutes),
so while it runs a lease thread pushes the expiry out every third of the TTL.
A pass that lost its lock anyway (a frozen process, an unreachable Redis) must
not act on what it read: it calls `ensure_held()` before each such action,
which raises `LockLost`, and `hold` ends the pass there as if another worker
had held the object from the start.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import contextmanager

import redis
from django.conf import settings

from controlplane.redis_client import get_redis

from .errors import RegattaError

log = logging.getLogger(__name__)

DIRTY = "regatta:dirty:"

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

PREFIX = "regatta:lock:"

_held = threading.local()


class LockLost(RegattaError):
    """The pass's lock expired or went to another holder: another worker may
    be acting on the same object, so what this pass read may be stale."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"lock {name!r} was lost in the middle of a pass")


def default_ttl() -> float:
    return float(getattr(settings, "RECONCILE_LOCK_TTL_S", 120.0))


class Lease:
    """One holding of one lock, kept alive until released or lost."""

    def __init__(self, client: redis.Redis, name: str, ttl_s: float):
        self.client, self.name, self.key = client, name, PREFIX + name
        self.token = secrets.token_hex(16)
        self.ttl_s = ttl_s
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.lost = False
        self._valid_until = 0.0  # monotonic: no other holder can exist before it
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> bool:
        asked = time.monotonic()
        if not self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
            return False
        self._valid_until = asked + self.ttl_s
        self._thread = threading.Thread(target=self._keep, name=f"lease:{self.name}",
                                        daemon=True)
        self._thread.start()
        return True

    def renew(self) -> bool:
        """Push the expiry out again; False once the lock is no longer ours."""
        with self._mutex:
            if self.lost:
                return False
            asked = time.monotonic()
            try:
                ours = bool(self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_ms))
            except redis.RedisError as exc:
                # Unreachable is not lost: until the last expiry we set, nobody
                # else can have taken it.
                ours = asked < self._valid_until
                log.warning("lock %s not renewed (%s); %s", self.name, exc,
                            "still ours" if ours else "counting it lost")
            else:
                if ours:
                    self._valid_until = asked + self.ttl_s
            self.lost = not ours
            return ours

    def check(self) -> None:
        if not self.renew():
            raise LockLost(self.name)

    def _keep(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            if not self.renew():
                log.warning("lock %s was lost while its pass ran", self.name)
                return

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.client.eval(_RELEASE, 1, self.key, self.token)


def _leases() -> list[Lease]:
    if not hasattr(_held, "leases"):
        _held.leases = []
    return _held.leases


@contextmanager
def hold(name: str, ttl_s: float | None = None):
    """Yield True while holding the lock `name`, False when another holder has it.

    The body runs either way; callers check the flag and skip work on False.
    A `LockLost` for this lock raised in the body ends the body quietly: the
    pass stops, and the holder that has the lock now does the work.
    """
    lease = Lease(get_redis(), name, ttl_s or default_ttl())
    if not lease.acquire():
        yield False
        return
    _leases().append(lease)
    try:
        yield True
    except LockLost as exc:
        if exc.name != name:
            raise
        log.warning("stopped a pass that lost its lock %s", name)
    finally:
        _leases().remove(lease)
        lease.release()


def ensure_held() -> None:
    """Raise LockLost unless every lock this thread holds is still its own,
    and renew them. A pass calls it after a long step and before acting on
    what it read earlier. Outside any lock (tests calling a pass directly) it
    does nothing."""
    for lease in list(_leases()):
        lease.check()


def is_held(name: str) -> bool:
    return bool(get_redis().exists(PREFIX + name))


def once_within(name: str, seconds: float) -> bool:
    """True the first time `name` is claimed within `seconds`; used so a short
    requeue is scheduled once, not once per pass that asked for it."""
    ms = max(1, int(seconds * 1000))
    return bool(get_redis().set("regatta:once:" + name, "1", nx=True, px=ms))


def mark_dirty(name: str) -> None:
    """Note that `name` was asked for while another worker held it, so that
    holder looks again once it lets go (`take_dirty`): the ask is not lost,
    as a controller's work queue keeps an item added while it is processed.
    The note lasts a lock's TTL: if its holder dies, the sweep stands in."""
    get_redis().set(DIRTY + name, "1", px=max(1, int(default_ttl() * 1000)))


def take_dirty(name: str) -> bool:
    """True once per `mark_dirty` since the last take (an atomic delete)."""
    return bool(get_redis().delete(DIRTY + name))

