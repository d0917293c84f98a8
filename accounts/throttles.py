"""Throttles against guessing passwords and minting tokens in bulk.

Django REST Framework's SimpleRateThrottle counts in the cache (Redis, so
every web process counts together); the rates are settings
(REGATTA_LOGIN_RATE, REGATTA_TOKEN_CREATE_RATE). An over-limit request gets
429 with Retry-After and changes nothing.
"""

from functools import wraps

from django.http import HttpResponse
from rest_framework.throttling import SimpleRateThrottle, UserRateThrottle


class TokenCreateThrottle(UserRateThrottle):
    scope = "token_create"


class LoginThrottle(SimpleRateThrottle):
    """Sign-in attempts per user name, wherever they come from: a guesser
    spread over many addresses is slowed as much as one. (Someone who
    knows a name can keep its owner out for a minute at a time, no longer.)"""

    scope = "login"

    def get_cache_key(self, request, view):
        name = str(request.POST.get("username", ""))[:150].casefold()
        return self.cache_format % {"scope": self.scope, "ident": name or self.get_ident(request)}


def throttle_login(view):
    """Wrap a login view: a POST past the rate is 429, before any password
    is checked."""
    @wraps(view)
    def throttled(request, *args, **kwargs):
        if request.method == "POST":
            throttle = LoginThrottle()
            if not throttle.allow_request(request, None):
                wait = max(1, round(throttle.wait() or 1))
                response = HttpResponse(
                    f"Too many sign-in attempts for this user; try again in {wait} s.\n",
                    status=429, content_type="text/plain")
                response["Retry-After"] = str(wait)
                return response
        return view(request, *args, **kwargs)
    return throttled
