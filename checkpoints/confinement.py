"""Where a job's checkpoints may live, and which checkpoint URIs a worker may
report.

The deployment declares storage roots (REGATTA_STORAGE_ROOTS: absolute paths
and s3://bucket/prefix; by default the checkpoint root under the state
folder). A cluster may narrow them with a `storage_roots` list in its
settings, never widen them: `allowed_roots(cluster)` is the one place that
reads it. A job's storage is `<root>/<team>/<something>`: under a root and
inside its own team's folder, so no team can read, overwrite or have
retention delete another team's checkpoints.

Paths are canonicalised before they are compared (`..` resolved, `//`
collapsed) and a path that passes through a symlink below the root is
refused, since the link could point anywhere. S3 keys are literal, so a `.`
or `..` segment in one is refused rather than resolved.

Whoever runs a job can write in its folder, so a link can appear there at
any level at any time (a step folder linked to another team's step). The
symlink check looks at every component below the root when the job is
submitted, when a worker reports a checkpoint or a profile trace
(`link_below_root`: a 400), when a person restarts from a step, and each
time the control plane opens the storage (`require_real_path`: downloads,
resume, retention). Past that check every read goes through
`storage_base`'s root with no link followed (ConfinedLocalStorage,
checkpoints/beneath.py), so a link swapped in a moment later is refused too.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import PurePosixPath

from django.conf import settings

from controlplane.env import parse_storage_root
from controlplane.lib.typed_settings import SettingsError


class OutsideRoots(ValueError):
    """A storage URI this job may not use; the message says why."""


def deployment_roots() -> list[str]:
    return list(settings.STORAGE_ROOTS) or [parse_storage_root(str(settings.CHECKPOINT_ROOT))]


def allowed_roots(cluster) -> list[str]:
    """The roots jobs on `cluster` may use: the deployment's, or the subset
    the cluster's `storage_roots` setting names (each under a deployment
    root). The first is where jobs that name no storage get theirs."""
    roots = deployment_roots()
    try:  # the typed cluster settings (clusters/settings.py) check it is a list of strings
        declared = cluster.config.storage_roots
    except SettingsError as exc:
        raise OutsideRoots(f"cluster {cluster.name}: {exc}") from None
    if declared is None:
        return roots
    if not declared:
        raise OutsideRoots(f"cluster {cluster.name}'s storage_roots setting must be a "
                           "non-empty list of paths or s3:// URIs.")
    narrowed = []
    for raw in declared:
        try:
            root = parse_storage_root(raw)
        except ValueError as exc:
            raise OutsideRoots(f"cluster {cluster.name}'s storage root {exc}") from None
        if not any(_within(root, outer, strict=False) for outer in roots):
            raise OutsideRoots(f"cluster {cluster.name}'s storage root {root} is not under "
                               f"any of the deployment's ({', '.join(roots)}).")
        narrowed.append(root)
    return narrowed


def default_storage_uri(team_name: str, job_id: int, cluster) -> str:
    return f"{allowed_roots(cluster)[0]}/{team_name}/job-{job_id}"


def confine(uri: str, team_name: str, cluster) -> str:
    """The canonical form of `uri` if a job of `team_name` on `cluster` may
    keep its checkpoints there; raises OutsideRoots with the reason if not."""
    try:
        canonical = parse_storage_root(uri)
    except ValueError as exc:
        raise OutsideRoots(f"The storage URI {exc}.") from None
    roots = allowed_roots(cluster)
    for root in roots:
        team_folder = f"{root}/{team_name}"
        if _within(canonical, team_folder, strict=True):
            if not canonical.startswith("s3://"):
                _refuse_symlinks(root, canonical)
            return canonical
    places = ", ".join(f"{root}/{team_name}/…" for root in roots)
    raise OutsideRoots(f"{canonical} is not inside your team's storage: use a folder under "
                       f"{places}.")


def _within(path: str, folder: str, *, strict: bool) -> bool:
    if path == folder:
        return not strict
    return path.startswith(folder.rstrip("/") + "/")


def _refuse_symlinks(root: str, path: str) -> None:
    """No existing component between the root and `path` may be a symlink."""
    current = root
    for part in PurePosixPath(posixpath.relpath(path, root)).parts:
        current = posixpath.join(current, part)
        if os.path.islink(current):
            raise OutsideRoots(f"{current} is a symbolic link; give the real folder instead.")
        if not os.path.exists(current):
            return


def require_real_path(uri: str) -> None:
    """Raises OutsideRoots unless the folder at `uri` (a filesystem path) is
    really where its name says: its real path is the real path of the
    deployment root it lies under, followed by the same names, with no
    symbolic link made below the root since submission. A link at or above
    the root (a root on a mounted volume) is the operator's and is fine.
    S3 keys hold no links; a path under no root (a job stored before the
    roots existed) is left as it is."""
    if uri.startswith("s3://"):
        return
    try:
        canonical = parse_storage_root(uri)
    except ValueError as exc:
        raise OutsideRoots(f"The storage URI {exc}.") from None
    for root in deployment_roots():
        if _within(canonical, root, strict=True):
            expected = os.path.join(os.path.realpath(root), os.path.relpath(canonical, root))
            if os.path.realpath(canonical) != expected:
                raise OutsideRoots(f"{canonical} passes through a symbolic link made below "
                                   f"{root} after the job was submitted; it is not used.")
            return


def _local_path(uri: str) -> str | None:
    if uri.startswith("s3://"):
        return None
    try:
        return parse_storage_root(uri)
    except ValueError:
        return None


def _root_of(path: str) -> str | None:
    return next((root for root in deployment_roots() if _within(path, root, strict=True)), None)


def storage_base(uri: str) -> str | None:
    """The folder below which no link in `uri`'s storage is followed: the
    deployment root it lies under, or the storage folder itself when it lies
    under none (a job stored before the roots existed). None for S3."""
    path = _local_path(uri)
    if path is None:
        return None
    return _root_of(path) or path


def link_below_root(uri: str) -> str | None:
    """The first component of `uri` (a path or file:// URI) below its
    deployment root that is a symbolic link, or None when there is none
    (or the path lies under no root, or on S3)."""
    path = _local_path(uri)
    root = _root_of(path) if path is not None else None
    if root is None:
        return None
    current = root
    for part in PurePosixPath(posixpath.relpath(path, root)).parts:
        current = posixpath.join(current, part)
        if os.path.islink(current):
            return current
        if not os.path.exists(current):
            return None
    return None


def reported_step_uri_ok(storage_uri: str, step: int, uri: str) -> bool:
    """Whether a worker's checkpoint `uri` is exactly its job's `step-<step>`
    folder, spelled as the trainer's storage spells it: `file://<path>` or
    the plain path for a filesystem, `s3://bucket/prefix` for S3 (see
    worker_image/regatta/storage.py, `step_uri`)."""
    return reported_key_uri_ok(storage_uri, f"step-{step}", uri)


def reported_key_uri_ok(storage_uri: str, key: str, uri: str) -> bool:
    """Whether a worker's `uri` is exactly `key` (a relative path the
    control plane computed, e.g. a profile trace's) inside its job's storage,
    spelled as the worker's storage spells it."""
    if storage_uri.startswith("s3://"):
        bucket, _, prefix = storage_uri[len("s3://"):].partition("/")
        base = f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"
        return uri == f"{base}/{key}"
    path = storage_uri[len("file://"):] if storage_uri.startswith("file://") else storage_uri
    # As LocalStorage spells its root: Path(root).absolute() collapses // and
    # a trailing slash and leaves the rest as it was.
    base = str(PurePosixPath(path))
    return uri in (f"{base}/{key}", f"file://{base}/{key}")
