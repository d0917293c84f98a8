"""The job-API part for attempts made as Kubeflow Trainer v2 TrainJobs
(cluster setting `job_api: trainjob`; trainjob.py builds and reads them).
Its interface is PyTorchJobCalls' (pytorchjob_calls.py). It goes through the
provider's own plumbing (`_call`, `_json`, `reads`), so timeouts and the
error classes are the PyTorchJob path's."""

from __future__ import annotations

from kubernetes import client as k8s

from controlplane.lib.errors import PermanentError

from ..base import AttemptStatus, LaunchRequest
from . import manifests as mf
from . import trainjob as tj
from .kinds import TRAINJOB


class TrainJobCalls:
    kind = TRAINJOB

    def __init__(self, provider, queue):
        """`queue`: the cluster's queue part (queues.py); a TrainJob waits
        in Kueue or in none."""
        self.p = provider
        self.queue = queue

    @property
    def ns(self) -> str:
        return self.p.ns

    def get(self, name: str) -> dict | None:
        return self.p.reads.job(TRAINJOB, name)

    def create(self, body: dict, attempt_id: str = "") -> dict:
        name = body["metadata"]["name"]
        created = self.p._call(f"create TrainJob {name}",
                               self.p.custom.create_namespaced_custom_object,
                               tj.GROUP, tj.VERSION, self.ns, tj.PLURAL, body, ok=(409,))
        if created is not None:
            return created
        existing = self.get(name)
        labels = (existing or {}).get("metadata", {}).get("labels") or {}
        if existing is None or labels.get(mf.MANAGED_BY) != mf.MANAGER or (
                labels.get(mf.LABEL_ATTEMPT) != attempt_id):
            raise PermanentError(f"TrainJob {self.ns}/{name} exists and is not this attempt's")
        return existing

    def launch(self, request: LaunchRequest) -> dict:
        """As the PyTorchJob's launch: the TrainJob, then its token Secret
        owned by it."""
        p = self.p
        secret = mf.token_secret(request, p.settings)
        body = tj.train_job(request, p.settings, p._allocatable(request))
        p._release_capacity(request.pool, {pl.node for pl in request.placements})
        job = self.create(body, str(request.attempt_id))
        secret.metadata.owner_references = [tj.owner_reference(job)]
        p._ensure_secret(mf.to_dict(secret), str(request.attempt_id))
        return {
            "provider": p.kind, "kind": tj.KIND, "namespace": self.ns, "name": request.name,
            "uid": job["metadata"].get("uid", ""), "secret": secret.metadata.name,
            "placements": [{"node": pl.node, "node_rank": pl.node_rank}
                           for pl in sorted(request.placements, key=lambda pl: pl.node_rank)],
        }

    def observe(self, ref: dict) -> AttemptStatus:
        p, name = self.p, ref["name"]
        job = self.get(name)
        pods, jobset, workload, lost, refused = [], None, None, {}, []
        if job is not None:
            selector = tj.pods_selector(name)
            pods = p.reads.pods(selector, f"list pods of {name}")
            jobset = p.reads.jobset(name)
            # This JobSet's pods only: an earlier TrainJob of the same name
            # made pods of its own.
            uid = ((jobset or {}).get("metadata") or {}).get("uid")
            ours = [pod for pod in p.reads.pod_tombstones(selector)
                    if uid and (pod["metadata"].get("labels") or {}).get(tj.JOBSET_UID_LABEL)
                    == uid]
            lost, refused = p._lost_and_refused(job, pods, ours, tj.rank_of,
                                                len(ref.get("placements", [])))
            if not tj.started(jobset) or tj.suspended(job):
                workload = self.queue.holding(job).get("workload")
        status = tj.attempt_status(job, jobset, pods, ref.get("placements", []),
                                   workload=workload,
                                   own_secret=ref.get("secret") or mf.secret_name(name),
                                   lost=lost, refused=refused)
        return p._with_log_tails(status, pods, container=tj.CONTAINER)

    def stop(self, ref: dict, grace_s: float) -> None:
        """Deleting the TrainJob is enough: its JobSet, the JobSet's Jobs and
        their pods, and the token Secret are all garbage-collected with it.

        Always in the background, whatever `delete_propagation` says for
        PyTorchJobs: the Trainer (v2.3) reconciles a TrainJob under deletion
        like any other, re-applying its JobSet (a Failed one too, since it
        clears that condition first), so a foreground deletion, which keeps
        the TrainJob until its JobSet is gone, can chase the garbage
        collector for minutes. Once the TrainJob itself is gone the Trainer
        leaves it be."""
        p, name = self.p, ref["name"]
        p.keep_unread(tj.pods_selector(name), tj.CONTAINER)
        options = k8s.V1DeleteOptions(propagation_policy="Background",
                                      grace_period_seconds=int(grace_s))
        p._call(f"delete TrainJob {name}", p.custom.delete_namespaced_custom_object,
                tj.GROUP, tj.VERSION, self.ns, tj.PLURAL, name, body=options, ok=(404,))
        secret = ref.get("secret") or mf.secret_name(name)
        p._call(f"delete secret {secret}", p.core.delete_namespaced_secret, secret, self.ns,
                ok=(404,))
