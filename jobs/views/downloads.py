"""Downloads: an exported model's files and a committed checkpoint's files.

Scoped exactly like the job they came from: another team's artifact or
checkpoint is 404, like one that does not exist. A path that is not a plain
relative path the listing names (`..`, absolute, a link out of the folder)
is 404 as well, so the answer never tells what lies outside.
"""

from urllib.parse import quote

from django.http import FileResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import APIException, NotAcceptable, NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsPerson
from checkpoints import downloads
from checkpoints.beneath import LinkRefused
from checkpoints.models import Checkpoint, ModelArtifact

from ..checkpointing import open_job_storage
from ..visibility import visible_jobs

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
CHECKPOINT_REFUSALS = {
    409: OpenApiResponse(description="The checkpoint is not committed or verified (being "
                                     "written, corrupt, deleted), or its folder is a "
                                     "symbolic link."),
    503: OpenApiResponse(description="Its storage cannot be reached or opened now."),
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


class ArtifactFilesView(DownloadView):
    """The files of an exported model, with their sizes and checksums."""

    @extend_schema(operation_id="artifact_files_list", responses=FileListing)
    def get(self, request, pk):
        artifact = get_object_or_404(_artifacts(request.user), pk=pk)
        return self.listing(request, downloads.artifact_files(artifact),
                            f"/api/v1/artifacts/{artifact.pk}/files/")


class ArtifactFileView(DownloadView):
    """One file of an exported model, streamed as an attachment."""

    @extend_schema(operation_id="artifact_file_download", responses=FILE_RESPONSES)
    def get(self, request, pk, path):
        artifact = get_object_or_404(_artifacts(request.user), pk=pk)
        try:
            opened = downloads.open_artifact_file(artifact, path)
        except downloads.NotThere:
            raise NotFound(f"artifact {artifact.pk} has no file {path!r}.") from None
        return self.stream(opened, path)


class CheckpointFilesView(DownloadView):
    """The files of a committed or verified checkpoint: the manifest's
    files (with their sha256), the manifest and the commit marker."""

    @extend_schema(operation_id="checkpoint_files_list",
                   responses={200: FileListing, **CHECKPOINT_REFUSALS})
    def get(self, request, pk):
        checkpoint = _loadable_checkpoint(request.user, pk)
        storage = _storage(checkpoint)
        try:
            files = _storage_call(downloads.checkpoint_files, checkpoint.step, storage)
        except downloads.NotThere:
            raise NotFound(f"step-{checkpoint.step} has no manifest in its storage.") from None
        return self.listing(request, files, f"/api/v1/checkpoints/{checkpoint.pk}/files/")


class CheckpointFileView(DownloadView):
    """One file of a committed or verified checkpoint, streamed from local
    storage or from S3 as the object's body arrives."""

    @extend_schema(operation_id="checkpoint_file_download",
                   responses={**FILE_RESPONSES, **CHECKPOINT_REFUSALS})
    def get(self, request, pk, path):
        checkpoint = _loadable_checkpoint(request.user, pk)
        storage = _storage(checkpoint)
        try:
            opened = _storage_call(downloads.open_checkpoint_file, checkpoint.step, storage,
                                   path)
        except downloads.NotThere:
            raise NotFound(f"checkpoint {checkpoint.pk} has no file {path!r}.") from None
        return self.stream(opened, path)


def _artifacts(user):
    return ModelArtifact.objects.filter(job__in=visible_jobs(user).values("pk"))


def _loadable_checkpoint(user, pk) -> Checkpoint:
    checkpoint = get_object_or_404(
        Checkpoint.objects.select_related("job__cluster").filter(
            job__in=visible_jobs(user).values("pk")),
        pk=pk)
    if checkpoint.state not in Checkpoint.LOADABLE:
        raise StateConflict({"detail": f"checkpoint {checkpoint.pk} (step {checkpoint.step}) is "
                                       f"{checkpoint.state}: only a committed or verified "
                                       "checkpoint is downloaded.",
                             "current": checkpoint.state})
    return checkpoint


def _storage(checkpoint):
    try:
        return open_job_storage(checkpoint.job)
    except Exception as exc:  # a bad storage setting: permanent, but not the caller's fault
        raise StorageUnavailable(f"the checkpoint's storage cannot be opened: {exc}") from None


def _storage_call(fn, *args):
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
