"""The Kubernetes provider: Kubeflow PyTorchJobs on a cluster's GPU nodes.

Every call goes through `_call`, which adds the request timeout and sorts
failures into temporary / permanent / other (errors.py). Deletes treat 404
as done and creates treat 409 as done when the existing object is ours, so
each method may be called again after a crash halfway through.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from controlplane.lib.errors import PermanentError, TemporaryError

from ..base import (
    AttemptStatus,
    HealthSignal,
    LateLog,
    LaunchRequest,
    NodeInfo,
    Placement,
    PoolInfo,
    PreflightResult,
    ScalingStatus,
)
from . import capacity, kept_logs, reachability
from . import manifests as mf
from .config import KubePoolSettings, KubeSettings, replace_mode
from .errors import classify, unanswered
from .informers import ClusterCache, shared
from .kinds import PYTORCHJOB, JobKind
from .observe import (
    CORDONED_BY_REGATTA,
    attempt_status,
    event_issues,
    lost_ranks,
    node_info,
    node_rank,
    node_signals,
    pods_by_rank,
    started,
    suspended,
)
from .preflight import run_allreduce, run_dcgm_labels
from .reads import CachedReads, LiveReads
from .resources import smallest_allocatable
from .trainjob import KIND as TRAINJOB_KIND
from .trainjob_calls import TrainJobCalls


def api_client_for(settings: KubeSettings) -> k8s.ApiClient:
    """An ApiClient from the cluster's connection settings."""
    cfg = k8s.Configuration()
    try:
        if settings.api_url:
            cfg.host = settings.api_url.rstrip("/")
        elif settings.in_cluster:
            kube_config.load_incluster_config(client_configuration=cfg)
        elif settings.kubeconfig or settings.context:
            kube_config.load_kube_config(
                config_file=settings.kubeconfig or None, context=settings.context or None,
                client_configuration=cfg,
            )
        else:
            raise PermanentError(
                "cluster settings need 'in_cluster', 'kubeconfig'/'context' or 'api_url'")
    except (kube_config.ConfigException, OSError) as exc:
        raise PermanentError(f"cannot load Kubernetes credentials: {exc}") from exc
    # urllib3 would try a request 4 times, each up to the timeout: a stalled
    # server would hold a call four timeouts. Once more on a read error only
    # (a kept-alive connection the server had closed), never on a connect.
    cfg.retries = urllib3.Retry(total=1, connect=0, read=1, redirect=0, status=0, other=0)
    return k8s.ApiClient(cfg)


def shared_cache(settings: KubeSettings) -> ClusterCache:
    """The informers this process keeps for the cluster these settings
    reach (informers.py): one set per API server, identity and namespace,
    whichever pass asks."""
    key = (settings.api_url, settings.kubeconfig, settings.context, settings.in_cluster,
           settings.namespace)
    return shared(key, lambda: ClusterCache(
        api_client_for(settings), settings.namespace, f"{mf.MANAGED_BY}={mf.MANAGER}",
        reachability.request_timeout(settings.request_timeout_s)))


class KubernetesProvider:
    kind = "kubernetes"

    def __init__(self, api_client: k8s.ApiClient, settings: KubeSettings,
                 aws_factory: Callable[[], Any] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 cache: ClusterCache | None = None):
        """`cache`: the process's informers of this cluster (for_cluster);
        without it every read is a request (reads.py)."""
        self.settings = settings
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self._aws_factory = aws_factory
        self._aws = None
        self._sleep, self._clock = sleep, clock
        self.reach = reachability.of(api_client.configuration.host)
        # Attempts made as TrainJobs (job_api trainjob); an attempt is observed
        # and stopped by the kind its reference names, so attempts launched
        # before the setting changed are still found.
        self._trainjobs = TrainJobCalls(self)
        self.reads = CachedReads(self, cache) if cache is not None else LiveReads(self)
        # Failed pods whose log this provider could not read ({pod: why}):
        # kept past the attempt's stop, for a later read (kept_logs.py).
        self.unread_logs: dict[str, str] = {}

    # The typed sections of Cluster.settings and NodePool.settings this
    # provider reads (clusters/settings.py parses them).
    Settings = KubeSettings
    PoolSettings = KubePoolSettings

    @classmethod
    def for_cluster(cls, name: str, settings: KubeSettings) -> KubernetesProvider:
        def aws():
            from .aws_node_groups import AwsNodeGroups  # boto3 only for AWS-backed pools

            return AwsNodeGroups.for_settings(settings)

        return cls(api_client_for(settings), settings, aws_factory=aws,
                   cache=shared_cache(settings))

    @property
    def ns(self) -> str:
        return self.settings.namespace

    def aws(self):
        if self._aws is None:
            if self._aws_factory is None:
                raise PermanentError("this cluster has no AWS settings")
            self._aws = self._aws_factory()
        return self._aws

    # --- plumbing -----------------------------------------------------------------
    @property
    def timeout(self) -> tuple[float, float]:
        """(connect, read) for one request (reachability.py says why a pair)."""
        return reachability.request_timeout(self.settings.request_timeout_s)

    def _call(self, what: str, fn: Callable, *args, ok: tuple[int, ...] = (), **kwargs):
        """Call the API; statuses in `ok` return None instead of raising.
        While the server is counted away (reachability.py) nothing is sent."""
        self.reach.check(what)
        kwargs.setdefault("_request_timeout", self.timeout)
        try:
            found = fn(*args, **kwargs)
        except Exception as exc:
            if unanswered(exc):
                delay = self.reach.failed(f"{type(exc).__name__}: {exc}")
                raise TemporaryError(f"{what}: no answer from the API server: "
                                     f"{type(exc).__name__}: {exc}"[:1000], delay=delay) from exc
            if isinstance(exc, ApiException):
                self.reach.answered()
                if exc.status in ok:
                    return None
            mapped = classify(exc, what)
            if mapped is exc:
                raise
            raise mapped from exc
        self.reach.answered()
        return found

    def _json(self, what: str, fn: Callable, *args, ok: tuple[int, ...] = (), **kwargs):
        """Like _call, but the raw JSON the server sent, as dicts."""
        resp = self._call(what, fn, *args, ok=ok, _preload_content=False, **kwargs)
        return None if resp is None else json.loads(resp.data)

    def _create_job(self, body: dict, attempt_id: str | None) -> dict:
        name = body["metadata"]["name"]
        created = self._call(f"create PyTorchJob {name}",
                             self.custom.create_namespaced_custom_object,
                             mf.GROUP, mf.VERSION, self.ns, mf.PLURAL, body, ok=(409,))
        if created is not None:
            return created
        existing = self._get_kind(PYTORCHJOB, name)
        labels = (existing or {}).get("metadata", {}).get("labels") or {}
        if existing is None or labels.get(mf.MANAGED_BY) != mf.MANAGER or (
                attempt_id is not None and labels.get(mf.LABEL_ATTEMPT) != attempt_id):
            raise PermanentError(f"PyTorchJob {self.ns}/{name} exists and is not this attempt's")
        return existing

    # --- nodes ----------------------------------------------------------------------
    def _pool_nodes(self, pool: PoolInfo) -> list[dict]:
        return self.reads.nodes(dict(pool.node_selector))

    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        nodes = [self.reads.derived("info", n, node_info) for n in self._pool_nodes(pool)]
        if pool.settings.node_autoscaler == "karpenter":
            return nodes + self._spares_coming(pool, {n.name for n in nodes})
        if not pool.settings.asg_name:
            return nodes
        # An instance of the group that has not registered yet (a spare or a
        # replacement still booting) is the pool's all the same: listed not
        # ready, so the reconciler keeps its row instead of calling it gone.
        joined = {_instance(n.provider_id) for n in nodes} | {n.name for n in nodes}
        booting = [n for n in self.aws().list_nodes(pool)
                   if _instance(n.provider_id) not in joined and n.name not in joined]
        return nodes + booting

    def _capacity_pods(self, pool: PoolInfo, **query) -> list[dict]:
        return self.reads.pods(capacity.selector(pool), f"list capacity pods of {pool.name}",
                               **query)

    def _spares_coming(self, pool: PoolInfo, joined: set[str]) -> list[NodeInfo]:
        """Spares asked of Karpenter whose node has not joined yet: listed not
        ready under the name Regatta gave them, so their rows wait."""
        coming = []
        for pod in self._capacity_pods(pool):
            name = (pod["metadata"].get("labels") or {}).get(capacity.LABEL_FOR)
            if name and (pod.get("spec") or {}).get("nodeName") not in joined:
                coming.append(NodeInfo(name=name, ready=False, gpus=pool.gpus_per_node))
        return coming

    def _ask_capacity(self, pool: PoolInfo, key: str, spare_name: str = "",
                      avoid: tuple[str, ...] = ()) -> None:
        # Karpenter launches only for a pod that no node can take. Kept off
        # every node the pool has now: the scheduler would bind it to an idle
        # one, Karpenter would see nothing pending, and the pool would be a
        # node short after each replacement (or never get its spare).
        present = tuple(n["metadata"]["name"] for n in self._pool_nodes(pool))
        body = mf.to_dict(capacity.capacity_pod(pool, self.settings, key,
                                                spare_name=spare_name,
                                                avoid=tuple(set(avoid) | set(present))))
        # 409: asked before (a repeated call), one pod all the same.
        self._call(f"create capacity pod for {key}", self.core.create_namespaced_pod,
                   self.ns, body, ok=(409,))

    def provision_node(self, pool: PoolInfo, name: str) -> NodeInfo:
        if pool.settings.node_autoscaler == "karpenter":
            self._ask_capacity(pool, f"spare/{name}", spare_name=name)
            return NodeInfo(name=name, ready=False, gpus=pool.gpus_per_node)
        if not pool.settings.asg_name:
            raise PermanentError(
                f"pool {pool.name}: spares come from its node group; set 'asg_name' to let "
                "Regatta add one")
        node = self.aws().provision(pool)
        if node is None:
            # The group is launching (this ask or an earlier one): its instance
            # is listed, and joins as a spare, in a later pass. A row under a
            # name of ours would only be found gone then.
            raise TemporaryError(f"pool {pool.name}: Auto Scaling group "
                                 f"{pool.settings.asg_name} is launching an instance")
        return node

    def health_signals(self, pool: PoolInfo) -> list[HealthSignal]:
        settings = self.settings
        # What node_signals reads of the settings: the memo's key with the node's.
        reads = repr((sorted(settings.health_conditions.items()),
                      sorted(settings.health_labels.items())))
        signals = [s for n in self._pool_nodes(pool)
                   for s in self.reads.derived(f"signals {reads}", n,
                                               lambda node: node_signals(node, settings))]
        if pool.settings.spot_queue_url:
            signals.extend(self.aws().spot_signals(pool))
        return signals

    def _set_unschedulable(self, node: str, value: bool) -> None:
        """Regatta's own cordon carries CORDONED_BY_REGATTA, so it is told
        apart from an admin's (NodeInfo.admin_hold). A node someone else
        cordoned is left as it is both ways: cordoning it again would take
        their hold for Regatta's, and lifting it would undo their act."""
        found = self.reads.node_now(node)
        if found is None:
            return  # gone: no cordon needed; the node listing reports it lost
        annotations = (found.get("metadata") or {}).get("annotations") or {}
        if (found.get("spec") or {}).get("unschedulable") and (
                CORDONED_BY_REGATTA not in annotations):
            return
        mark = {CORDONED_BY_REGATTA: "true"} if value else {CORDONED_BY_REGATTA: None}
        # 404: gone since; the node listing reports it lost.
        self.reads.wrote("nodes", self._json(
            f"patch node {node}", self.core.patch_node, node,
            {"metadata": {"annotations": mark}, "spec": {"unschedulable": value}}, ok=(404,)))

    def cordon(self, pool: PoolInfo, node: str) -> None:
        self._set_unschedulable(node, True)

    def claim_cordon(self, pool: PoolInfo, node: str) -> None:
        """Mark the node's cordon as Regatta's own. For a node the cluster's
        rows say Regatta took out of service itself, cordoned without the
        mark: a cordon Regatta made before it marked its cordons (an admin's
        `kubectl cordon` of a node already cordoned changes nothing in
        Kubernetes, so there is no other act to undo). From then on it is
        lifted with Regatta's return to service like any other of its own
        (clusters/reconcile/follow.py asks)."""
        found = self.reads.node_now(node)
        if found is None or not (found.get("spec") or {}).get("unschedulable"):
            return
        if CORDONED_BY_REGATTA in ((found.get("metadata") or {}).get("annotations") or {}):
            return
        self.reads.wrote("nodes", self._json(
            f"patch node {node}", self.core.patch_node, node,
            {"metadata": {"annotations": {CORDONED_BY_REGATTA: "true"}}}, ok=(404,)))

    def uncordon(self, pool: PoolInfo, node: str) -> None:
        self._set_unschedulable(node, False)

    def drain(self, pool: PoolInfo, node: str, grace_s: float = 60.0) -> None:
        """Cordon, then evict Regatta's pods on the node. The grace period is
        at least the pods' own, so the trainer can finish its emergency
        checkpoint after SIGTERM."""
        self.cordon(pool, node)
        grace = int(max(grace_s, self.settings.termination_grace_s))
        pods = self.reads.pods(f"{mf.MANAGED_BY}={mf.MANAGER}", f"list pods on {node}",
                               field_selector=f"spec.nodeName={node}")
        for pod in pods:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            name = pod["metadata"]["name"]
            # 429 means a disruption budget forbids it now: temporary, retried.
            self._call(f"evict pod {name}", self.core.create_namespaced_pod_eviction,
                       name, self.ns, mf.eviction(name, self.ns, grace), ok=(404,))

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        """By the pool's `replace_mode` (docs/kubernetes.md, "replace").

        With an Auto Scaling group: terminate the instance through the group
        without lowering its desired capacity, so the group launches a new one
        (listed by a later pass; nothing waits for it here), then delete the
        Node so its pods go at once. The instance is found by the Node's providerID, or by the
        node's name among the group's instances when the Node object is gone
        already. With Karpenter: delete the Node; Karpenter's finalizer
        terminates the instance and it launches capacity anew."""
        mode = replace_mode(pool.name, pool.settings)
        new = None
        if mode == "asg":
            found = self._json(f"read node {node}", self.core.read_node, node, ok=(404,))
            provider_id = ((found or {}).get("spec") or {}).get("providerID", "")
            aws = self.aws()
            provider_id = provider_id or aws.provider_id_for(pool, node)
            # No live instance behind it: it left the group already (a repeat call).
            if provider_id:
                new = aws.replace(pool, provider_id)
        self._call(f"delete node {node}", self.core.delete_node, node, ok=(404,))
        if mode == "node-delete":
            # Karpenter launches only for a pending pod: ask for the successor,
            # which joins the pool by its labels (list_nodes) in a later pass.
            self._ask_capacity(pool, f"replaces/{node}", avoid=(node,))
        return new

    def hold_spares(self, pool: PoolInfo, nodes: list[str]) -> None:
        """A standby pod on each of `nodes`, the pool's ready spares, and on
        no other node (capacity.py): the spare's GPUs held for Regatta and
        the trainer image kept on it."""
        if not self.settings.standbys or pool.settings.node_autoscaler == "karpenter":
            return
        held = {}
        for pod in self._standby_pods(pool):
            node = (pod["metadata"].get("labels") or {}).get(capacity.LABEL_STANDBY_FOR)
            if node in nodes and not pod["metadata"].get("deletionTimestamp"):
                held[node] = pod
            else:
                self._delete_pod(pod["metadata"]["name"], "standby pod")
        for node in nodes:
            if node not in held:
                body = mf.to_dict(capacity.standby_pod(pool, self.settings, node))
                # 409: one is still going away; the next pass makes it again.
                self._call(f"create standby pod for {node}", self.core.create_namespaced_pod,
                           self.ns, body, ok=(409,))

    def _standby_pods(self, pool: PoolInfo) -> list[dict]:
        return self.reads.pods(capacity.standby_selector(pool),
                               f"list standby pods of {pool.name}")

    def _delete_pod(self, name: str, what: str) -> None:
        self._call(f"delete {what} {name}", self.core.delete_namespaced_pod, name, self.ns,
                   grace_period_seconds=0, ok=(404,))

    def scaling_status(self, pool: PoolInfo, since) -> ScalingStatus:
        """The Auto Scaling group's account of the asks (aws.py); Karpenter's
        capacity pods wait in their own pending state instead."""
        if not pool.settings.asg_name:
            return ScalingStatus()
        return self.aws().scaling_status(pool, since)

    def release(self, pool: PoolInfo, node: str, provider_id: str) -> str | None:
        if not pool.settings.asg_name or not provider_id.startswith("aws://"):
            return ""
        return self.aws().release(pool, provider_id)

    # --- attempts -----------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> dict:
        """The PyTorchJob first, then its token Secret owned by it (so the
        Secret goes when the job goes). Pods that start in between wait for
        the Secret; the control plane's Role has no `patch` on secrets, so the
        owner is set at creation."""
        if self.settings.job_api == "trainjob":
            return self._trainjobs.launch(request)
        secret = mf.token_secret(request, self.settings)
        body = mf.to_dict(mf.pytorch_job(request, self.settings, self._allocatable(request)))
        self._release_capacity(request.pool, {p.node for p in request.placements})
        job = self._create_job(body, str(request.attempt_id))
        secret.metadata.owner_references = [mf.owner_reference(job)]
        self._ensure_secret(mf.to_dict(secret), str(request.attempt_id))
        return {
            "provider": self.kind, "namespace": self.ns, "name": request.name,
            "uid": job["metadata"].get("uid", ""), "secret": secret.metadata.name,
            "placements": [{"node": p.node, "node_rank": p.node_rank}
                           for p in sorted(request.placements, key=lambda p: p.node_rank)],
        }

    def _release_capacity(self, pool: PoolInfo, placed: set[str]) -> None:
        """Free the GPUs that capacity and standby pods hold on the placed
        nodes, before the training (or preflight) pods ask for them
        (capacity.py). A standby is found by the node it stands for, bound
        yet or not."""
        if pool.settings.node_autoscaler == "karpenter":
            for pod in self._capacity_pods(pool):
                if (pod.get("spec") or {}).get("nodeName") in placed:
                    self._delete_pod(pod["metadata"]["name"], "capacity pod")
        if self.settings.standbys:
            for pod in self._standby_pods(pool):
                if (pod["metadata"].get("labels") or {}).get(
                        capacity.LABEL_STANDBY_FOR) in placed:
                    self._delete_pod(pod["metadata"]["name"], "standby pod")

    def _allocatable(self, request: LaunchRequest) -> dict | None:
        """The smallest allocatable among the placed nodes, which sizes the
        pods' CPU and memory (resources.py); not read when the pool sets both."""
        pool = request.pool
        if not pool.settings.guaranteed_qos or (pool.settings.cpu_per_gpu
                                                and pool.settings.memory_per_gpu):
            return None
        placed = {p.node for p in request.placements}
        return smallest_allocatable([n for n in self._pool_nodes(pool)
                                     if n["metadata"]["name"] in placed])

    def _ensure_secret(self, secret: dict, attempt_id: str) -> None:
        name = secret["metadata"]["name"]
        for _ in range(2):
            if self._call(f"create secret {name}", self.core.create_namespaced_secret,
                          self.ns, secret, ok=(409,)) is not None:
                return
            existing = self._json(f"read secret {name}", self.core.read_namespaced_secret,
                                  name, self.ns, ok=(404,))
            if existing is None:
                continue
            if (existing["metadata"].get("labels") or {}).get(mf.LABEL_ATTEMPT) != attempt_id:
                raise PermanentError(f"secret {self.ns}/{name} exists and is not this attempt's")
            # A relaunch may carry a fresh token: replace the secret rather than
            # trust the old one.
            self._call(f"delete secret {name}", self.core.delete_namespaced_secret, name,
                       self.ns, ok=(404,))
        raise TemporaryError(f"secret {self.ns}/{name} keeps coming back; retry", delay=2.0)

    def observe(self, ref: dict) -> AttemptStatus:
        if ref.get("kind") == TRAINJOB_KIND:
            return self._trainjobs.observe(ref)
        name = ref["name"]
        job = self._get_kind(PYTORCHJOB, name)
        pods, lost, refused = [], {}, []
        if job is not None:
            selector = f"{mf.OPERATOR_JOB_LABEL}={name}"
            pods = self.reads.pods(selector, f"list pods of {name}")
            uid = job["metadata"].get("uid")
            ours = [p for p in self.reads.pod_tombstones(selector)
                    if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])]
            lost, refused = self._lost_and_refused(job, pods, ours, node_rank,
                                                   len(ref.get("placements", [])))
        workload = podgroup = None
        if job is not None and (not started(job) or suspended(job)):
            # Only a gang not yet started can be held back by its scheduler,
            # and only a suspended one taken back by Kueue; reading its queue
            # object then costs one call per observe.
            if self.settings.gang_scheduler == "kueue":
                workload = self._workload(job)
            elif self.settings.gang_scheduler == "volcano":
                podgroup = self.reads.podgroup(name)
        status = attempt_status(job, pods, ref.get("placements", []), workload=workload,
                                podgroup=podgroup,
                                own_secret=ref.get("secret") or mf.secret_name(name),
                                lost=lost, refused=refused)
        return self._with_log_tails(status, pods)

    def _lost_and_refused(self, job: dict, pods: list[dict], tombstones: list[dict],
                          rank_of, ranks: int) -> tuple[dict, list]:
        """The ranks lost with their node (observe.lost_ranks), and, while a
        rank has no pod, why its controller could not make one
        (observe.event_issues)."""
        by_rank = pods_by_rank(pods, rank_of)
        bound = {(p.get("spec") or {}).get("nodeName") for p in [*pods, *tombstones]}
        gone = self.reads.gone_nodes({n for n in bound if n})
        lost = lost_ranks(by_rank, tombstones, gone, rank_of)
        refused = []
        if len(by_rank) < ranks:
            refused = event_issues(self.reads.events(), job["metadata"]["name"],
                                   since=job["metadata"].get("creationTimestamp") or "")
        return lost, refused

    def _workload(self, job: dict) -> dict | None:
        """Kueue's Workload of a job, found by the job-uid label Kueue puts
        on it (its name carries a hash of Kueue's choosing)."""
        items = self.reads.workloads(job["metadata"].get("uid", ""), job["metadata"]["name"])
        return items[0] if items else None

    def _with_log_tails(self, status: AttemptStatus, pods: list[dict],
                        container: str = mf.CONTAINER) -> AttemptStatus:
        names = {(p.get("spec") or {}).get("nodeName"): p["metadata"]["name"] for p in pods}
        nodes = []
        for proc in status.nodes:
            pod = names.get(proc.node)
            if proc in status.failed_nodes and not proc.log_tail and pod:
                tail, unreachable = self.read_log(pod, container, tail_lines=40)
                if unreachable:
                    self.unread_logs[pod] = unreachable
                proc = replace(proc, log_tail=tail[-4000:] or unreachable)
            nodes.append(proc)
        return replace(status, nodes=tuple(nodes))

    def read_log(self, pod: str, container: str, tail_lines: int) -> tuple[str, str]:
        """(the log's last lines as text, "") or ("", why it could not be read).

        Never raises: a failure is acted on with what is known, and a kubelet
        that cannot be reached (pods/log answers 500) or a pod already gone
        must not hold it up. Read as raw bytes and decoded here: the client
        would otherwise parse a log that happens to be one JSON line into a
        dict and hand back its repr. A slow log is not the API server being
        away (the server waits on the kubelet), so it counts for nothing in
        reachability."""
        what = f"read log of {pod}"
        try:
            self.reach.check(what)
            resp = self.core.read_namespaced_pod_log(
                pod, self.ns, container=container, tail_lines=tail_lines,
                _preload_content=False, _request_timeout=self.timeout)
            data = resp.data
        except TemporaryError as exc:
            return "", f"(log not read: {exc})"
        except ApiException as exc:
            said = f"HTTP {exc.status} {exc.reason or ''}".strip()
            return "", f"(log unreachable: pods/log answered {said})"
        except Exception as exc:  # noqa: BLE001 - a log is never worth failing the pass
            return "", f"(log unreachable: {type(exc).__name__}: {exc})"[:500]
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)
        return text, ""

    def stop(self, ref: dict, grace_s: float = 30.0) -> None:
        if ref.get("kind") == TRAINJOB_KIND:
            return self._trainjobs.stop(ref, grace_s)
        name = ref["name"]
        self.keep_unread(f"{mf.OPERATOR_JOB_LABEL}={name}", mf.CONTAINER)
        options = k8s.V1DeleteOptions(
            propagation_policy=self.settings.delete_propagation,
            grace_period_seconds=int(grace_s),
        )
        self._call(f"delete PyTorchJob {name}", self.custom.delete_namespaced_custom_object,
                   mf.GROUP, mf.VERSION, self.ns, mf.PLURAL, name, body=options, ok=(404,))
        # Owned by the job, so garbage collection takes it too; deleting it here
        # frees the name at once for Background propagation.
        secret = ref.get("secret") or mf.secret_name(name)
        self._call(f"delete secret {secret}", self.core.delete_namespaced_secret, secret,
                   self.ns, ok=(404,))

    def keep_unread(self, selector: str, container: str) -> None:
        """Before the attempt's job object (and with it its pods) is deleted:
        keep the failed pods among `selector`'s whose log could not be read,
        for one more read later (kept_logs.py)."""
        if self.unread_logs:
            kept_logs.keep(self, self.unread_logs, selector, container)

    def late_logs(self, now: float | None = None) -> list[LateLog]:
        """The logs of kept pods, read once more (kept_logs.collect); `now`
        in Unix seconds."""
        return kept_logs.collect(self, now)

    # --- preflight ------------------------------------------------------------------
    def preflight(self, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float = 60.0) -> PreflightResult:
        if self.settings.preflight == "dcgm-labels":
            return run_dcgm_labels(self, placements)
        # The check's pods need the GPUs a Karpenter spare's capacity pod holds.
        self._release_capacity(pool, {p.node for p in placements})
        return run_allreduce(self, pool, placements, timeout_s)

    def _get_kind(self, kind: JobKind, name: str) -> dict | None:
        return self.reads.job(kind, name)


def _instance(provider_id: str) -> str:
    return provider_id.rstrip("/").rsplit("/", 1)[-1] if provider_id else ""

