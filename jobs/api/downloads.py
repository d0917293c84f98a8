"""File downloads as every job-scoped API serves them: a binary answer
whatever the Accept header asks (errors stay JSON), listings with sizes and
checksums, and storage errors as a caller should see them (404, 409, 503;
never a 500). Used by the checkpoint and artifact downloads (jobs/views/)
and the profiling feature's traces."""

from urllib.parse import quote

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import APIException, NotAcceptable
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsPerson
from checkpoints import downloads
from checkpoints.beneath import LinkRefused

FileListing = inline_serializer("FileListing", {
    "files": serializers.ListField(child=inline_serializer("DownloadableFile", {
        "path": serializers.CharField(),
        "bytes": serializers.IntegerField(),
        "sha256": serializers.CharField(help_text="empty where no checksum was recorded"),
        "url": serializers.CharField(),
    })),
    "bytes": serializers.IntegerField(),
})

FILE_RESPONSES = {
    (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY,
                                                       description="the file's bytes"),
    404: OpenApiResponse(description="no such file, or not yours"),
}

class StateConflict(APIException):
    status_code = 409
    default_code = "conflict"


class StorageUnavailable(APIException):
    status_code = 503
    default_code = "storage_unavailable"
    default_detail = "The checkpoint's storage cannot be reached now; try again."


class DownloadView(APIView):
    """A binary answer whatever the Accept header asks (errors stay JSON)."""

    permission_classes = [IsPerson]

    def perform_content_negotiation(self, request, force=False):
        try:
            return super().perform_content_negotiation(request, force)
        except NotAcceptable:
            return super().perform_content_negotiation(request, force=True)

    def listing(self, request, files, base_url):
        return Response({
            "files": [{"path": f.path, "bytes": f.bytes, "sha256": f.sha256,
                       "url": request.build_absolute_uri(base_url + quote(f.path))}
                      for f in files],
            "bytes": sum(f.bytes for f in files),
        })

    @staticmethod
    def stream(opened: downloads.OpenedFile, path: str) -> FileResponse:
        response = FileResponse(opened.stream, as_attachment=True,
                                filename=path.rsplit("/", 1)[-1],
                                content_type="application/octet-stream")
        response["Content-Length"] = str(opened.size)
        response["X-Content-Type-Options"] = "nosniff"
        if opened.sha256:
            response["X-Checksum-Sha256"] = opened.sha256
        return response


def storage_call(fn, *args):
    """Storage errors as the caller should see them: a missing file is 404,
    a storage that fails is 503, never a 500."""
    try:
        return fn(*args)
    except downloads.NotThere:
        raise
    except LinkRefused as exc:
        raise StateConflict(f"{exc}: the checkpoint's files are not served.") from None
    except FileNotFoundError:
        raise downloads.NotThere(str(args[-1])) from None
    except OSError as exc:
        raise StorageUnavailable() from exc
    except Exception as exc:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, BotoCoreError | ClientError):
            raise StorageUnavailable() from exc
        raise
