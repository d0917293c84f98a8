"""Saving, committing and pruning `step-N/` checkpoints.

A save of DCP state (`Checkpointer.save`) has three phases:
1. every rank hands its state to DCP: a synchronous `dcp.save`, or an async
   one, which blocks the step only while the state is copied to host memory
   (staged) and agreed staged on every rank;
2. in a background thread each rank waits for DCP, writes its rank state,
   hashes the files it wrote (and uploads them, for S3);
3. at a step boundary where every rank's phase 2 is done (agreed through the
   run's per-step agreement, regatta/agreement.py), the file lists are
   gathered to rank 0, which writes `manifest.json` and then `COMMITTED`,
   reports, and prunes (only when no control plane owns retention: see
   `LeftToControlPlane`).
Only phase 1 ever blocks a step, unless the next save or the exit needs the
previous one finished first. A save of files a program wrote
(`save_files`) is phases 2 and 3, synchronously.

A survivor's hand-over (`hand_over`) is the one save with no collective: a
peer died, so one rank writes the whole step, every rank's state included,
into a folder of its own and renames it into place.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import AsyncStager

from regatta import manifest as mf
from regatta.dist import Dist
from regatta.retention import KeepLast, LeftToControlPlane
from regatta.staging import reused_buffers_factory
from regatta.state import Export, to_state_dict
from regatta.storage import Storage, step_name

log = logging.getLogger("regatta.checkpoint")

STATE_DIR = "trainer_state"
CONFIG_FILE = "config.json"
# In a step folder on object storage: which survivor writes a hand-over.
HANDOVER_CLAIM = ".handover-claim"


@dataclass
class PendingSave:
    step: int
    started: float
    blocking_s: float
    local: Future  # -> dict of this rank's manifest entries
    emergency: bool = False
    request_id: str | None = None
    synchronous: bool = False


@dataclass
class SaveJob:
    """One save as every rank describes it."""

    step: int
    target: Path
    rank_state: bytes | None
    started: float
    emergency: bool = False
    request_id: str | None = None


class Checkpointer:
    def __init__(self, storage: Storage, d: Dist, config: dict[str, Any] | None,
                 staging_root: Path, retention: KeepLast | LeftToControlPlane, reporter,
                 stager_factory: Callable[[], AsyncStager] | None = None):
        self.storage = storage
        self.d = d
        self.config = config
        self.staging_root = Path(staging_root) / f"rank-{d.rank}"
        self.retention = retention
        self.reporter = reporter
        self.pending: PendingSave | None = None
        self.last_committed: int | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-finish")
        self._stager_factory = stager_factory or reused_buffers_factory(d.device)
        # Cleared after an async save fails: the failure is most likely the
        # async machinery's (a staging bug in a torch release, host memory),
        # so the rest of the run saves synchronously, which is slower but
        # known to work.
        self.async_enabled = True
        # Set when an async save failed after it started (found at commit):
        # the caller saves synchronously at once, in its place.
        self.fallback_due = False

    # -- saving ---------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        """Where this rank writes step-N's files: the step folder itself on a
        filesystem, a local staging folder (uploaded at the save) for S3."""
        direct = self.storage.local_dir(step)
        return direct if direct is not None else self.staging_root / step_name(step)

    def save(self, step: int, state: Any, rank_state: Any = None, *, use_async: bool,
             emergency: bool = False, request_id: str | None = None,
             export: Export | None = None) -> bool:
        """Start (async) or complete (sync) a save of DCP state; every rank
        calls this at the same step.

        Never raises for a failed save: an async save whose staging fails on
        any rank is reported (`checkpoint_failed`) and taken again
        synchronously, once; a failed synchronous save is reported and
        training goes on. Returns whether a save is now pending or committed.
        """
        if self.pending is not None:
            self.commit_pending()
        job = SaveJob(step, self._prepare_target(step), _pickled(rank_state),
                      time.monotonic(), emergency, request_id)
        state_dict = to_state_dict(state)
        if use_async and self.async_enabled and export is None:
            errors = self._agreed(*self._stage_into(state_dict), job)
            if not errors:
                return True
            self.async_enabled = False
            self._failed(step, errors, fallback="a synchronous save of the same step")
        return self._save_sync(state_dict, job, export)

    def save_files(self, step: int, folder: Path | None, *, emergency: bool = False,
                   request_id: str | None = None) -> bool:
        """Commit the files this rank put in `folder` (default: `step_dir`)
        as step-N; collective, synchronous."""
        if self.pending is not None:
            self.commit_pending()
        started = time.monotonic()
        target = self.step_dir(step)
        if folder is None:
            # Every rank may write into the one step folder: list it only
            # once all have finished writing, or a rank hashes a peer's file
            # half-written (and its entry, a wrong size, commits a checkpoint
            # that never verifies).
            dist.barrier(group=self.d.ckpt_group)
        try:
            mine = _copy_in(Path(folder), target) if folder is not None else _files_in(target)
            if self.config is not None and self.d.rank != 0:
                # Rank 0 writes the run's config into the step folder now and
                # hashes it itself: a peer listing the shared folder would
                # hash it half-written, or an earlier commit's copy.
                mine = [rel for rel in mine if rel != CONFIG_FILE]
            local = self._pool.submit(self._finish_files, step, target, mine)
            local.result()
        except Exception as exc:  # reported by commit_pending on every rank
            local = Future()
            local.set_exception(exc)
        self.pending = PendingSave(step, started, time.monotonic() - started, local, emergency,
                                   request_id, synchronous=True)
        return self.commit_pending() is not None

    def _prepare_target(self, step: int) -> Path:
        target = self.step_dir(step)
        # A folder left at this step by an earlier attempt (or a failed save)
        # is stale: clear it before any rank writes, so no old file is
        # mistaken for a new one; but only once every rank is past its reads
        # of it: a run resumed at its last step saves that same step as it
        # starts, and a peer still loading it would find it gone.
        dist.barrier(group=self.d.ckpt_group)
        if self.d.rank == 0 and step in self.storage.list_steps():
            self.storage.delete_step(step)
        if self.storage.local_dir(step) is None:
            shutil.rmtree(target, ignore_errors=True)
        dist.barrier(group=self.d.ckpt_group)
        target.mkdir(parents=True, exist_ok=True)
        return target

    def _stage_into(self, state: dict) -> tuple[dict | None, str | None]:
        """This rank's copy of `state` in host memory, through a stager the
        factory makes for this save (by default over buffers reused for the
        whole run: regatta/staging.py says why not DCP's DefaultStager).
        Returns (staged, None) or (None, this rank's error)."""
        stager = None
        try:
            stager = self._stager_factory()
            staged = stager.stage(state)
            if isinstance(staged, Future):
                staged = staged.result()
            return staged, None
        except Exception as exc:  # any staging failure: a sync save instead
            log.exception("staging the checkpoint failed")
            return None, f"rank {self.d.rank}: staging failed: {type(exc).__name__}: {exc}"
        finally:
            if stager is not None:
                with contextlib.suppress(Exception):
                    stager.close()

    def _agreed(self, staged: dict | None, error: str | None, job: SaveJob) -> list[str]:
        """Every rank learns every rank's staging error; the write starts only
        if there are none (a rank that skipped it would leave the others' DCP
        collectives waiting). One small gloo collective, at save steps only."""
        errors: list = [None] * self.d.world_size
        dist.all_gather_object(errors, error, group=self.d.ckpt_group)
        errors = [e for e in errors if e]
        if not errors:
            self._start_async_write(staged, job)
        return errors

    def _start_async_write(self, staged: dict, job: SaveJob) -> None:
        writer = dcp.FileSystemWriter(str(job.target))
        dcp_future = dcp.async_save(staged, storage_writer=writer,
                                    process_group=self.d.ckpt_group,
                                    async_stager=_AlreadyStaged())
        local = self._pool.submit(self._finish_local, job, dcp_future, ())
        self.pending = PendingSave(job.step, job.started, time.monotonic() - job.started, local,
                                   job.emergency, job.request_id)

    def _save_sync(self, state_dict: dict, job: SaveJob, export: Export | None) -> bool:
        try:
            # DCP first: its collectives must run on every rank whatever the
            # export does, and a checkpoint without its export is still one.
            dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(str(job.target)),
                     process_group=self.d.ckpt_group)
            extra = self._export(export, job) if export is not None else ()
            local = self._pool.submit(self._finish_local, job, None, extra)
            local.result()
        except Exception as exc:  # reported by commit_pending on every rank
            local = Future()
            local.set_exception(exc)
        self.pending = PendingSave(job.step, job.started, time.monotonic() - job.started, local,
                                   job.emergency, job.request_id, synchronous=True)
        return self.commit_pending() is not None

    def _export(self, export: Export, job: SaveJob) -> list[str]:
        """The consolidated model's files (rank 0's), or none if writing them
        failed: reported as `export_failed`, and the checkpoint commits
        without them."""
        try:
            return export.write(job.target, self.d)
        except Exception as exc:
            log.exception("exporting the model at step %d failed", job.step)
            self.reporter.event("export_failed", f"step-{job.step}: {type(exc).__name__}: "
                                f"{exc}"[:500], {"step": job.step, "rank": self.d.rank})
            return []

    def _finish_local(self, job: SaveJob, dcp_future, extra) -> dict:
        if dcp_future is not None:
            dcp_future.result()
        target, rank = job.target, self.d.rank
        mine = sorted(p.name for p in target.glob(f"__{rank}_*.distcp")) + list(extra)
        if job.rank_state is not None:
            rel_state = f"{STATE_DIR}/rank-{rank}.pt"
            (target / STATE_DIR).mkdir(parents=True, exist_ok=True)
            (target / rel_state).write_bytes(job.rank_state)
            mine.append(rel_state)
        if rank == 0:
            mine.append(".metadata")
        return self._finish_files(job.step, target, mine)

    def _finish_files(self, step: int, target: Path, mine: list[str]) -> dict:
        if self.d.rank == 0 and self.config is not None:
            (target / CONFIG_FILE).write_text(json.dumps(self.config, indent=1, sort_keys=True))
            mine = sorted(set(mine) | {CONFIG_FILE})
        entries = mf.hash_local_files(target, mine)
        if self.storage.local_dir(step) is None:
            self.storage.upload_dir(target, step, mine)
            shutil.rmtree(target, ignore_errors=True)
        return entries

    def commit_pending(self) -> int | None:
        """Finish the pending save on every rank and commit it; collective.

        Returns the committed step, or None when the save failed on some rank
        (reported as `checkpoint_failed`; for an async save `fallback_due`
        tells the caller to save synchronously now)."""
        p = self.pending
        if p is None:
            return None
        self.pending = None
        error = None
        try:
            entries = p.local.result()
        except Exception as exc:  # a failed save must not kill training
            error, entries = f"rank {self.d.rank}: {type(exc).__name__}: {exc}", None
        gathered = [None] * self.d.world_size if self.d.rank == 0 else None
        dist.gather_object((entries, error), gathered, dst=0, group=self.d.ckpt_group)
        outcome = [self._write_commit(p, gathered) if self.d.rank == 0 else None]
        # Doubles as the barrier: no rank moves on (or exits) before the marker
        # exists, and every rank learns whether it does.
        dist.broadcast_object_list(outcome, src=0, group=self.d.ckpt_group)
        if outcome[0] is True:
            self.last_committed = p.step
            return p.step
        # Every rank got the same outcome, so every rank takes the same path.
        if not p.synchronous:
            self.async_enabled = False
            self.fallback_due = True
        self._failed(p.step, outcome[0] or ["unknown"], fallback=(
            None if p.synchronous else "a synchronous save at this step boundary"))
        return None

    def _failed(self, step: int, errors: list[str], fallback: str | None) -> None:
        """Report a save that did not commit; rank 0 speaks for all."""
        log.error("checkpoint step-%d failed, not committed: %s", step, "; ".join(errors))
        if self.d.rank != 0:
            return
        message = f"step-{step} not committed"
        if fallback:
            message += f"; falling back to {fallback}"
        self.reporter.event("checkpoint_failed", message, {
            "step": step, "errors": errors, "fallback": fallback,
            "async_disabled": not self.async_enabled})

    def _write_commit(self, p: PendingSave, gathered: list) -> bool | list[str]:
        errors = [err for _, err in gathered if err]
        if errors:
            return errors
        files: dict[str, dict] = {}
        for entries, _ in gathered:
            files.update(entries)
        manifest_bytes = mf.build_manifest(p.step, files)
        prefix = step_name(p.step)
        self.storage.write_bytes(f"{prefix}/{mf.MANIFEST}", manifest_bytes)
        self.storage.write_bytes(f"{prefix}/{mf.MARKER}", mf.marker_for(manifest_bytes))
        save_s = time.monotonic() - p.started
        size = self._report_commit(p.step, files, manifest_bytes, save_s, p.blocking_s,
                                   p.emergency, p.request_id)
        log.info("checkpoint step-%d committed: %d bytes, %.2fs to save, %.3fs blocking",
                 p.step, size, save_s, p.blocking_s)
        self.retention.apply(self.storage)
        return True

    def _report_commit(self, step: int, files: dict, manifest_bytes: bytes, save_s: float,
                       blocking_s: float, emergency: bool, request_id: str | None) -> int:
        """Tell the control plane step-N is committed; returns its size in bytes."""
        size = sum(e["bytes"] for e in files.values()) + len(manifest_bytes)
        self.reporter.checkpoint({
            "step": step, "uri": self.storage.step_uri(step), "bytes": size,
            "manifest_sha256": mf.sha256_bytes(manifest_bytes),
            "save_seconds": round(save_s, 4), "blocking_seconds": round(blocking_s, 4),
            "emergency": emergency, "request_id": request_id,
        })
        return size

    def hand_over(self, step: int, state: Any, rank_states: dict[int, Any]) -> str:
        """Write step-N from this process alone, with no collective: a
        survivor's save after a peer died, of state this rank holds whole
        (DDP's replicated model and optimizer) with every rank's rank
        state, which the caller rebuilt. Survivors may race, and one alone
        may write step-N: each writes a folder of its own first; on a file
        system the first to rename it into place wins, on object storage the
        first to create the step's claim object (a conditional write) uploads.

        Returns "written" (this rank's folder is step-N), "taken" (step-N
        was committed already, or another survivor won), or why nothing
        was written."""
        if self.storage.is_committed(step):
            return "taken"
        started = time.monotonic()
        final = self.storage.local_dir(step)
        # Beside the step's folder, so that the rename stays on one file
        # system; in the staging folder when the step is uploaded.
        root = final.parent if final is not None else self.staging_root
        mine = root / f".{step_name(step)}.handover-{self.d.rank}-{os.getpid()}"
        shutil.rmtree(mine, ignore_errors=True)
        mine.mkdir(parents=True)
        try:
            dcp.save(to_state_dict(state), storage_writer=dcp.FileSystemWriter(str(mine)),
                     no_dist=True)
            files = sorted(p.name for p in mine.glob("*.distcp")) + [".metadata"]
            (mine / STATE_DIR).mkdir()
            for rank, rank_state in sorted(rank_states.items()):
                files.append(f"{STATE_DIR}/rank-{rank}.pt")
                (mine / files[-1]).write_bytes(_pickled(rank_state))
            if self.config is not None:
                (mine / CONFIG_FILE).write_text(json.dumps(self.config, indent=1, sort_keys=True))
                files.append(CONFIG_FILE)
            entries = mf.hash_local_files(mine, files)
            manifest_bytes = mf.build_manifest(step, entries)
            (mine / mf.MANIFEST).write_bytes(manifest_bytes)
            (mine / mf.MARKER).write_bytes(mf.marker_for(manifest_bytes))
            published = (_publish(mine, final) if final is not None
                         else self._upload_claimed(step, mine, files))
            if not published:
                return "taken"
        finally:
            shutil.rmtree(mine, ignore_errors=True)
        save_s = time.monotonic() - started
        size = self._report_commit(step, entries, manifest_bytes, save_s, blocking_s=save_s,
                                   emergency=True, request_id=None)
        log.info("checkpoint step-%d handed over by rank %d: %d bytes in %.2fs", step,
                 self.d.rank, size, save_s)
        self.last_committed = step
        return "written"

    def _upload_claimed(self, step: int, folder: Path, files: list[str]) -> bool:
        """Upload a survivor's step-N to object storage, which has no rename
        to settle a race: the survivor that creates the step's claim object
        first uploads, the others stand down. The manifest, then the marker,
        go last, as in every save: a survivor that dies half-way leaves a
        step that never committed, and the relaunch resumes from the one
        before."""
        prefix = step_name(step)
        if not self.storage.create_once(f"{prefix}/{HANDOVER_CLAIM}",
                                        f"rank {self.d.rank}\n".encode()):
            return False
        self.storage.upload_dir(folder, step, files)
        self.storage.upload_file(folder / mf.MANIFEST, f"{prefix}/{mf.MANIFEST}")
        self.storage.upload_file(folder / mf.MARKER, f"{prefix}/{mf.MARKER}")
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _publish(folder: Path, final: Path) -> bool:
    """Rename a complete step folder into place. False when a committed one
    is there already (another survivor's); a folder there with no marker is
    a save that never committed, moved aside and removed first."""
    for _ in range(3):
        try:
            os.rename(folder, final)
            return True
        except OSError:
            if (final / mf.MARKER).exists():
                return False
            aside = final.parent / f".{final.name}.stale-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
    return False


def _pickled(rank_state: Any) -> bytes | None:
    if rank_state is None:
        return None
    buf = io.BytesIO()
    torch.save(rank_state, buf)
    return buf.getvalue()


def _files_in(root: Path) -> list[str]:
    """The files a step folder holds, less a manifest and marker (of an
    earlier commit of this step: the commit writes its own)."""
    return sorted(rel for rel in (str(p.relative_to(root)) for p in root.rglob("*")
                                  if p.is_file()) if rel not in (mf.MANIFEST, mf.MARKER))


def open_for_writing(folder: Path) -> Path:
    """A step folder a program writes into: an earlier attempt's commit of
    the same step (being redone after a resume from an older one) stops
    counting as committed before any file in it changes. Any rank may call
    it, in any order: it removes only the marker and the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (mf.MARKER, mf.MANIFEST):
        (folder / name).unlink(missing_ok=True)
    return folder


def _copy_in(folder: Path, target: Path) -> list[str]:
    """Copy a program's checkpoint folder (or one file) into the step folder."""
    if folder.resolve() == target.resolve():
        return _files_in(target)
    target.mkdir(parents=True, exist_ok=True)
    if folder.is_file():
        shutil.copy2(folder, target / folder.name)
        return [folder.name]
    shutil.copytree(folder, target, dirs_exist_ok=True)
    return _files_in(folder)


class _AlreadyStaged:
    """The stager handed to dcp.async_save for a state this module staged
    itself (so that every rank could agree it staged before any rank writes)."""

    should_synchronize_after_execute = False

    def stage(self, state_dict):
        return state_dict

    def synchronize_staging(self) -> None: ...

    def close(self) -> None: ...
