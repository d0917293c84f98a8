"""A failed rank's log that could not be read is tried once more, later,
for the record.

A failure is acted on at once with what is known (client.read_log never
holds it up); but a log that `pods/log` could not fetch (the kubelet
unreachable, a timeout) is the user's error line lost, and deleting the
attempt's job object takes the pod, and its log, with it. So when the
attempt is stopped, each failed pod whose log the same pass could not
read is kept: detached from its job object (no owner, none of the labels
its controller selects it by, so the deletion does not take it and the
controller does not adopt it back) and marked KEPT with when and why. A
terminated pod holds no node's resources.

A later cluster pass (clusters/reconcile/late_logs.py) reads each kept pod's
log once, LATE_AFTER_S after it was kept, deletes the pod whatever the
read gave, and hands the text (or why it still could not be read) to the
job's timeline. Kept pods are read from the pod informer: a fleet without
any costs no request.
"""

from __future__ import annotations

import logging
import time

from controlplane.lib.errors import PermanentError, TemporaryError

from ..base import LateLog
from . import manifests as mf
from .observe import node_rank

log = logging.getLogger(__name__)

KEPT = "regatta.io/log-kept"
KEPT_AT = "regatta.io/log-kept-at"
KEPT_WHY = "regatta.io/log-unread"
KEPT_CONTAINER = "regatta.io/log-container"
# Long enough for a kubelet that was briefly unreachable (a restart, a
# network blip) to answer again; short enough that the job's timeline gets
# its error line while someone still looks.
LATE_AFTER_S = 20.0
# What a pod's controller selects its pods by: a pod that keeps one of these
# is adopted back by its controller (and then deleted with the job object).
CONTROLLER_LABELS = (mf.OPERATOR_JOB_LABEL, "batch.kubernetes.io/controller-uid",
                     "controller-uid", "batch.kubernetes.io/job-name", "job-name")
# The Job controller's finalizer: kept, the pod could never be deleted once
# the Job that would remove it is gone.
JOB_TRACKING = "batch.kubernetes.io/job-tracking"
TAIL_LINES = 200


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def detach(pod: dict, why: str, container: str, now: float) -> list[dict]:
    """The JSON patch that keeps `pod` past its job object's deletion."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    patch: list[dict] = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")}]
    if meta.get("ownerReferences"):
        patch.append({"op": "remove", "path": "/metadata/ownerReferences"})
    patch += [{"op": "remove", "path": f"/metadata/labels/{_pointer(k)}"}
              for k in CONTROLLER_LABELS if k in labels]
    patch.append({"op": "add", "path": f"/metadata/labels/{_pointer(KEPT)}", "value": "true"})
    if not meta.get("annotations"):
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in ((KEPT_AT, f"{now:.0f}"), (KEPT_WHY, why[:500]),
                       (KEPT_CONTAINER, container)):
        patch.append({"op": "add", "path": f"/metadata/annotations/{_pointer(key)}",
                      "value": value})
    finalizers = meta.get("finalizers") or []
    if JOB_TRACKING in finalizers:
        patch.append({"op": "replace", "path": "/metadata/finalizers",
                      "value": [f for f in finalizers if f != JOB_TRACKING]})
    return patch


def keep(provider, unread: dict[str, str], selector: str, container: str) -> list[str]:
    """Keep the pods of `unread` ({pod name: why its log was not read}) that
    are among the attempt's (`selector`); the names kept. Never raises: a
    pod not kept only loses its log, as before."""
    kept = []
    now = time.time()
    for pod in provider.reads.pods(selector, "list the attempt's pods"):
        name = pod["metadata"]["name"]
        if name not in unread:
            continue
        try:
            # 404: gone already; 422: not the pod it was (its uid changed).
            done = provider._call(f"keep pod {name} for its log",
                                  provider.core.patch_namespaced_pod, name, provider.ns,
                                  detach(pod, unread[name], container, now), ok=(404, 422))
        except (PermanentError, TemporaryError) as exc:
            # A Role without `patch` on pods (deploy/ before it granted it):
            # the pod goes with its job, its log unread.
            log.warning("pod %s not kept for its log: %s", name, exc)
            continue
        if done is not None:
            kept.append(name)
    return kept


def collect(provider, now: float | None = None) -> list[LateLog]:
    """Read, once, the log of each pod kept at least LATE_AFTER_S ago, and
    delete the pod; what each read gave."""
    now = time.time() if now is None else now
    found = []
    for pod in provider.reads.pods(f"{mf.MANAGED_BY}={mf.MANAGER},{KEPT}=true",
                                   "list pods kept for their logs"):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue  # read and deleted by an earlier pass
        notes = meta.get("annotations") or {}
        try:
            kept_at = float(notes.get(KEPT_AT) or 0)
        except ValueError:
            kept_at = 0.0
        if now - kept_at < LATE_AFTER_S:
            continue
        text, unreachable = provider.read_log(meta["name"], notes.get(KEPT_CONTAINER)
                                              or mf.CONTAINER, tail_lines=TAIL_LINES)
        provider._call(f"delete pod {meta['name']} kept for its log",
                       provider.core.delete_namespaced_pod, meta["name"], provider.ns,
                       grace_period_seconds=0, ok=(404,))
        labels = meta.get("labels") or {}
        found.append(LateLog(
            job_id=_int(labels.get(mf.LABEL_JOB)), attempt_id=_int(labels.get(mf.LABEL_ATTEMPT)),
            node=(pod.get("spec") or {}).get("nodeName") or "", node_rank=_rank(pod),
            text=text, unreachable=unreachable, first_unreachable=notes.get(KEPT_WHY, ""),
            kept_s=max(0.0, now - kept_at)))
    return found


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _rank(pod: dict) -> int | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    index = labels.get("batch.kubernetes.io/job-completion-index")
    if index is not None:  # a TrainJob's pod
        return _int(index)
    return node_rank(pod)
