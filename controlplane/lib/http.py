"""Request handling shared by every view, API and pages alike.

- A query parameter gets the cleaning a JSON body gets (parsers.py): a NUL
  or an unpaired surrogate is a 400 naming the parameter, before a view can
  hand it to PostgreSQL (which refuses it with a DataError, a 500).
- A URL missing its trailing slash is redirected with 308, which keeps the
  method and body, instead of Django's 301, which clients follow as a GET:
  a POST to /api/v1/jobs would otherwise turn into listing the jobs.
- An unknown path under /api/ answers a JSON 404 (and a crash a JSON 500),
  not an HTML page.
"""

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
