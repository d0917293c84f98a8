"""Downloads: an exported model's files and a committed checkpoint's files.

Scoped exactly like the job they came from: another team's artifact or
checkpoint is 404, like one that does not exist. A path that is not a plain
relative path the listing names (`..`, absolute, a link out of the folder)
is 404 as well, so the answer never tells what lies outside.
"""


from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound

from checkpoints import downloads
from checkpoints.models import Checkpoint, ModelArtifact
from jobs.api.downloads import (
    FILE_RESPONSES,
    DownloadView,
    FileListing,
    StateConflict,
    StorageUnavailable,
    storage_call,
)

from ..checkpointing import open_job_storage
from ..visibility import visible_jobs

CHECKPOINT_REFUSALS = {
    409: OpenApiResponse(description="The checkpoint is not committed or verified (being "
                                     "written, corrupt, deleted), or its folder is a "
                                     "symbolic link."),
    503: OpenApiResponse(description="Its storage cannot be reached or opened now."),
}


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
            files = storage_call(downloads.checkpoint_files, checkpoint.step, storage)
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
            opened = storage_call(downloads.open_checkpoint_file, checkpoint.step, storage,
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
