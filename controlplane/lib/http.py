"""Request handling shared by every view, API and pages alike.

- A query parameter gets the cleaning a JSON body gets (parsers.py): a NUL
  or an unpaired surrogate is a 400 naming the parameter, before a view can
  hand it to PostgreSQL (which refuses it with a DataError, a 500).
- A URL missing its trailing slash is redirected with 308, which keeps the
  method and body, instead of Django's 301, which clients follow as a GET:
  a POST to /api/v1/jobs would otherwise turn into listing the jobs.
- An unknown path under /api/ answers a JSON 404 (and a crash a JSON 500),
  not an HTML page.
- The caller's address (`client_address`) is REMOTE_ADDR, or behind
  REGATTA_TRUSTED_PROXIES proxies the address the outermost of them saw.
"""

from django.conf import settings
from django.http import HttpResponseBadRequest, JsonResponse
from django.http.response import HttpResponseRedirectBase
from django.middleware.common import CommonMiddleware
from django.utils.http import escape_leading_slashes
from django.views import defaults

from .parsers import _UNSTORABLE, API_PREFIX, BAD_STRING


class HttpResponsePermanentRedirectKeepMethod(HttpResponseRedirectBase):
    status_code = 308


class SlashRedirectMiddleware(CommonMiddleware):
    """Django's CommonMiddleware, answering 308 where it answers 301."""

    response_redirect_class = HttpResponsePermanentRedirectKeepMethod

    def get_full_path_with_slash(self, request):
        # Django raises here in DEBUG for a POST, since its 301 would lose
        # the body; a 308 keeps it.
        return escape_leading_slashes(request.get_full_path(force_append_slash=True))


class QueryStringMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        bad = sorted({_name(key) for key, values in request.GET.lists()
                      for text in (key, *values) if _UNSTORABLE.search(text)})
        if bad:
            if request.path.startswith(API_PREFIX):
                return JsonResponse({name: [BAD_STRING] for name in bad}, status=400)
            return HttpResponseBadRequest(f"Query parameter {', '.join(bad)}: {BAD_STRING}",
                                          content_type="text/plain")
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """Every response carries settings.CONTENT_SECURITY_POLICY (REGATTA_CSP)
    unless it set one of its own; none when the setting is empty."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response


def client_address(request) -> str:
    """Who called, as far as this process can know. With no trusted proxy
    (REGATTA_TRUSTED_PROXIES=0, the default) the peer's address: an
    X-Forwarded-For header is then the caller's own word, and ignored. With
    N trusted proxies, the Nth address from the right of X-Forwarded-For,
    the one the outermost trusted proxy saw (each proxy appends the address
    it heard from; anything further left the caller wrote)."""
    peer = request.META.get("REMOTE_ADDR", "")
    hops = settings.TRUSTED_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    if not hops or not forwarded:
        return peer
    seen = [part.strip() for part in forwarded.split(",")]
    return seen[-min(hops, len(seen))] or peer


def came_through_a_proxy(request) -> bool:
    """Whether the request carries a proxy's forwarding headers."""
    return any(name in request.META for name in
               ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"))


def _name(key: str) -> str:
    return key if not _UNSTORABLE.search(key) else ascii(key)


def page_not_found(request, exception):
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": "Internal server error."}, status=500)
    return defaults.server_error(request)
