"""Files opened beneath a trusted folder without following a symbolic link.

Whoever runs a job can write into its storage folder, and so can put a
symbolic link there: a step folder, a manifest or a shard that is really
another team's. Every component below the trusted folder (a deployment's
storage root, the artifact registry) is opened here with O_NOFOLLOW, each
from the folder opened before it (openat), so a link is refused wherever it
sits, and one swapped in between a check and the read is refused too: there
is no moment at which a path is resolved twice. Links at or above the
trusted folder (a root on a mounted volume) are the operator's, and are
followed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class LinkRefused(Exception):
    """A symbolic link below the trusted folder; the message names it."""


def parts_of(rel: str) -> list[str]:
    """The components of a relative path; refuses `..` and absolute paths,
    which would climb out of the folder."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts:
        raise LinkRefused(f"{rel!r} is not a path inside the folder")
    return parts


def _refusal(exc: OSError, where: str) -> Exception:
    # O_NOFOLLOW on a link fails with ELOOP (ENOTDIR too, with O_DIRECTORY,
    # on some systems); anything else is an ordinary error for the caller.
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return LinkRefused(f"{where} is a symbolic link; it is not followed")
    return exc


def open_dir(base: str, rel: str) -> int:
    """A descriptor of the folder `base/rel`, every component below `base`
    opened without following links. The caller closes it."""
    fd = os.open(base, _DIR)
    walked = base
    try:
        for part in parts_of(rel):
            walked = f"{walked}/{part}"
            try:
                child = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOTDIR and _is_link(fd, part):
                    raise LinkRefused(f"{walked} is a symbolic link; it is not followed") \
                        from None
                raise _refusal(exc, walked) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(base: str, rel: str) -> int:
    """A read-only descriptor of the regular file `base/rel`, no component
    below `base` a link. FileNotFoundError when absent (or not a regular
    file); LinkRefused for a link."""
    parts = parts_of(rel)
    if not parts:
        raise FileNotFoundError(rel)
    folder = open_dir(base, "/".join(parts[:-1]))
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_CLOEXEC | _NOFOLLOW, dir_fd=folder)
    except OSError as exc:
        raise _refusal(exc, f"{base}/{rel}") from None
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(rel)
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def entries(dir_fd: int) -> Iterator[os.DirEntry]:
    """The folder's entries, read through its descriptor (links stay links)."""
    with os.scandir(dir_fd) as found:  # scandir reads a duplicate, rewound after
        yield from found


def walk_files(dir_fd: int, prefix: str = "") -> Iterator[str]:
    """Relative paths of the regular files under the folder, recursively;
    links (to files or folders) are neither listed nor entered."""
    for entry in entries(dir_fd):
        if entry.is_dir(follow_symlinks=False):
            child = os.open(entry.name, _DIR | _NOFOLLOW, dir_fd=dir_fd)
            try:
                yield from walk_files(child, f"{prefix}{entry.name}/")
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            yield f"{prefix}{entry.name}"
