"""Per-object Redis locks around reconcile passes.

A lock is `SET key token NX PX ttl`; release deletes it only if it still holds
our token (a Lua compare-and-delete), so a pass that outlived its TTL never
frees a lock that another worker took since. The TTL is what keeps a worker
killed mid-pass from wedging the object: after it, the next sweep gets in.
"""

from __future__ import annotations

import secrets
from contextlib import contextmanager

from django.conf import settings

from controlplane.redis_client import get_redis

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""

PREFIX = "regatta:lock:"


def default_ttl() -> float:
    return float(getattr(settings, "RECONCILE_LOCK_TTL_S", 120.0))


@contextmanager
def hold(name: str, ttl_s: float | None = None):
    """Yield True while holding the lock `name`, False when another holder has it.

    The body runs either way; callers check the flag and skip work on False.
    """
    client = get_redis()
    key = PREFIX + name
    token = secrets.token_hex(16)
    ttl_ms = max(1, int((ttl_s or default_ttl()) * 1000))
    acquired = bool(client.set(key, token, nx=True, px=ttl_ms))
    try:
        yield acquired
    finally:
        if acquired:
            client.eval(_RELEASE, 1, key, token)


def is_held(name: str) -> bool:
    return bool(get_redis().exists(PREFIX + name))


def once_within(name: str, seconds: float) -> bool:
    """True the first time `name` is claimed within `seconds`; used so a short
    requeue is scheduled once, not once per pass that asked for it."""
    ms = max(1, int(seconds * 1000))
    return bool(get_redis().set("regatta:once:" + name, "1", nx=True, px=ms))
