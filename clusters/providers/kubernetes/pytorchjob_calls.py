"""The job-API part for attempts made as Kubeflow PyTorchJobs (v1, cluster
setting `job_api: pytorchjob`; manifests.py builds them, observe.py reads
them). Its interface is TrainJobCalls' (trainjob_calls.py): `kind`, `get`,
`create`, `launch`, `observe`, `stop`. It goes through the provider's own
plumbing (`_call`, `_json`, `reads`), so timeouts and the error classes are
the same whichever job API an attempt was made with.
"""

from __future__ import annotations

from kubernetes import client as k8s

from controlplane.lib.errors import PermanentError

from ..base import AttemptStatus, LaunchRequest
from . import manifests as mf
from .kinds import PYTORCHJOB
from .observe import attempt_status, node_rank, started, suspended


class PyTorchJobCalls:
    kind = PYTORCHJOB

    def __init__(self, provider, queue):
        """`queue`: the cluster's queue part (queues.py)."""
        self.p = provider
        self.queue = queue

    @property
    def ns(self) -> str:
        return self.p.ns

    def get(self, name: str) -> dict | None:
        return self.p.reads.job(PYTORCHJOB, name)

    def create(self, body: dict, attempt_id: str | None) -> dict:
        """Create the job; 409 is done when the existing one is ours (and,
        with `attempt_id`, this attempt's)."""
        name = body["metadata"]["name"]
        created = self.p._call(f"create PyTorchJob {name}",
                               self.p.custom.create_namespaced_custom_object,
                               mf.GROUP, mf.VERSION, self.ns, mf.PLURAL, body, ok=(409,))
        if created is not None:
            return created
        existing = self.get(name)
        labels = (existing or {}).get("metadata", {}).get("labels") or {}
        if existing is None or labels.get(mf.MANAGED_BY) != mf.MANAGER or (
                attempt_id is not None and labels.get(mf.LABEL_ATTEMPT) != attempt_id):
            raise PermanentError(f"PyTorchJob {self.ns}/{name} exists and is not this attempt's")
        return existing

    def launch(self, request: LaunchRequest) -> dict:
        """The PyTorchJob first, then its token Secret owned by it (so the
        Secret goes when the job goes). Pods that start in between wait for
        the Secret; the control plane's Role has no `patch` on secrets, so the
        owner is set at creation."""
        p = self.p
        secret = mf.token_secret(request, p.settings)
        body = mf.to_dict(mf.pytorch_job(request, p.settings, p._allocatable(request)))
        p._release_capacity(request.pool, {pl.node for pl in request.placements})
        job = self.create(body, str(request.attempt_id))
        secret.metadata.owner_references = [mf.owner_reference(job)]
        p._ensure_secret(mf.to_dict(secret), str(request.attempt_id))
        return {
            "provider": p.kind, "namespace": self.ns, "name": request.name,
            "uid": job["metadata"].get("uid", ""), "secret": secret.metadata.name,
            "placements": [{"node": pl.node, "node_rank": pl.node_rank}
                           for pl in sorted(request.placements, key=lambda pl: pl.node_rank)],
        }

    def observe(self, ref: dict) -> AttemptStatus:
        p, name = self.p, ref["name"]
        job = self.get(name)
        pods, lost, refused, held = [], {}, [], {}
        if job is not None:
            selector = f"{mf.OPERATOR_JOB_LABEL}={name}"
            pods = p.reads.pods(selector, f"list pods of {name}")
            uid = job["metadata"].get("uid")
            ours = [pod for pod in p.reads.pod_tombstones(selector)
                    if any(o.get("uid") == uid
                           for o in pod["metadata"].get("ownerReferences") or [])]
            lost, refused = p._lost_and_refused(job, pods, ours, node_rank,
                                                len(ref.get("placements", [])))
            # Only a gang not yet started can be held back by its queue, and
            # only a suspended one taken back by Kueue.
            if not started(job) or suspended(job):
                held = self.queue.holding(job)
        status = attempt_status(job, pods, ref.get("placements", []),
                                own_secret=ref.get("secret") or mf.secret_name(name),
                                lost=lost, refused=refused, **held)
        return p._with_log_tails(status, pods)

    def stop(self, ref: dict, grace_s: float) -> None:
        p, name = self.p, ref["name"]
        p.keep_unread(f"{mf.OPERATOR_JOB_LABEL}={name}", mf.CONTAINER)
        options = k8s.V1DeleteOptions(
            propagation_policy=p.settings.delete_propagation,
            grace_period_seconds=int(grace_s),
        )
        p._call(f"delete PyTorchJob {name}", p.custom.delete_namespaced_custom_object,
                mf.GROUP, mf.VERSION, self.ns, mf.PLURAL, name, body=options, ok=(404,))
        # Owned by the job, so garbage collection takes it too; deleting it here
        # frees the name at once for Background propagation.
        secret = ref.get("secret") or mf.secret_name(name)
        p._call(f"delete secret {secret}", p.core.delete_namespaced_secret, secret, self.ns,
                ok=(404,))
