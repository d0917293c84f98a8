"""Throttles against guessing passwords and against acts repeated in bulk
(minting tokens, sending webhook pings and retries).

A `Budget` is a sliding window of uses per identity, kept in Redis so every
web process counts together. A use is taken before the act and given back
when the act did not happen, in one Lua script each, so requests racing
each other can never take more than the rate allows, and only what was
done counts: a refused token request (400) costs nothing, a failed sign-in
costs one, a successful one nothing. An over-limit request gets 429 with
Retry-After and changes nothing. The rates are settings
(REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], from REGATTA_*_RATE).
"""

from __future__ import annotations

import hashlib
import logging
import time
import unicodedata
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import wraps

from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from rest_framework.exceptions import Throttled

from controlplane.lib.http import client_address
from controlplane.redis_client import get_redis

log = logging.getLogger(__name__)

PREFIX = "regatta-throttle:"
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# KEYS[1]: the window; ARGV: now, window seconds, limit, this use's member.
# Returns nil when the use was taken, else the seconds until one is free.
_TAKE = """
local now, span, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - span)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(tonumber(oldest[2]) + span - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], math.ceil(span * 1000))
return false
"""


class Budget:
    """`scope`'s rate (e.g. 10/min) of uses per identity."""

    def __init__(self, scope: str):
        self.scope = scope
        count, _, period = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"][scope].partition("/")
        self.limit = int(count)
        self.span = _PERIODS[period[0]]

    def _key(self, ident: str) -> str:
        # Hashed: an identity is whatever a caller typed, of any length.
        return f"{PREFIX}{self.scope}:{hashlib.sha256(ident.encode()).hexdigest()}"

    def take(self, ident: str) -> tuple[str | None, float]:
        """(a receipt for give_back, 0) when a use was free, else (None,
        seconds until one is)."""
        receipt = uuid.uuid4().hex
        wait = get_redis().eval(_TAKE, 1, self._key(ident), repr(time.time()), self.span,
                                self.limit, receipt)
        if wait is None:
            return receipt, 0.0
        return None, max(1.0, float(wait))

    def give_back(self, ident: str, receipt: str) -> None:
        get_redis().zrem(self._key(ident), receipt)


@contextmanager
def spend(scope: str, ident) -> Iterator[None]:
    """Take one use of `scope` for `ident` around an act: 429 (DRF's
    Throttled, with Retry-After) when none is left, given back when the
    act raises (a refusal, a conflict), so only acts done are counted."""
    budget, ident = Budget(scope), str(ident)
    receipt, wait = budget.take(ident)
    if receipt is None:
        raise Throttled(wait=wait)
    try:
        yield
    except BaseException:
        budget.give_back(ident, receipt)
        raise


# --- sign-in -----------------------------------------------------------------

def account_name(raw) -> str:
    """The user name as authentication reads it, so every spelling that
    signs in as one account counts against that account: stripped and
    NFKC-normalised as Django's sign-in form does (" bob", "bob\\t" and
    full-width "ｂｏｂ" are all "bob"), then case-folded, since a user
    model may compare names without case (Django's compares them exactly:
    then "BOB" shares bob's count, which costs nobody a guess)."""
    name = unicodedata.normalize("NFKC", str(raw or "").strip())
    field = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD)
    return unicodedata.normalize("NFKC", name[: field.max_length or 150].casefold())


def _too_many(wait: float, who: str) -> HttpResponse:
    wait_s = max(1, round(wait))
    response = HttpResponse(f"Too many sign-in attempts {who}; try again in {wait_s} s.\n",
                            status=429, content_type="text/plain")
    response["Retry-After"] = str(wait_s)
    return response


def _signed_in(request, response) -> bool:
    # A sign-in view answers a successful POST with a redirect, once
    # auth.login has put the user on the request.
    user = getattr(request, "user", None)
    return response.status_code in (302, 303) and bool(user and user.is_authenticated)


def throttle_login(view):
    """Wrap a sign-in view (the login page, the admin's): failed sign-ins
    are counted per account (`login`, REGATTA_LOGIN_RATE) and per client
    address (`login_address`, REGATTA_LOGIN_ADDRESS_RATE). With either
    spent, a POST is 429 before any password is checked: guessing one
    account's password from many addresses, or many accounts' from one
    address, is slowed alike. (Someone who knows a name can keep its owner
    from signing in for one window at a time, no longer.)"""
    @wraps(view)
    def throttled(request, *args, **kwargs):
        if request.method != "POST":
            return view(request, *args, **kwargs)
        account, address = Budget("login"), Budget("login_address")
        name, ip = account_name(request.POST.get("username")), client_address(request)
        account_receipt, wait = account.take(name)
        if account_receipt is None:
            return _too_many(wait, "for this user")
        address_receipt, wait = address.take(ip)
        if address_receipt is None:
            account.give_back(name, account_receipt)
            return _too_many(wait, "from this address")
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            account.give_back(name, account_receipt)
            address.give_back(ip, address_receipt)
            raise
        if _signed_in(request, response):  # only failures count
            account.give_back(name, account_receipt)
            address.give_back(ip, address_receipt)
        return response
    return throttled
