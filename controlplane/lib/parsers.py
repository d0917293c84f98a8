"""Request body parsing that honours DATA_UPLOAD_MAX_MEMORY_SIZE.

DRF hands its parsers the raw request stream, which skips Django's body size
check; reading `HttpRequest.body` first applies it (RequestDataTooBig → 413,
see controlplane.lib.api) before a byte is parsed.
"""

import io

from rest_framework.parsers import JSONParser


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        django_request = getattr(request, "_request", None)
        if django_request is not None and not django_request._read_started:
            stream = io.BytesIO(django_request.body)
        return super().parse(stream, media_type, parser_context)
