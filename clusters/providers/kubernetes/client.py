"""The Kubernetes provider: Kubeflow training jobs on a cluster's GPU nodes.

It is assembled from three parts, each chosen by the settings: the job API
new attempts are made with (`job_api`: pytorchjob_calls.py or
trainjob_calls.py), the queue their gangs wait in (`gang_scheduler`:
queues.py), and, per pool, the node source behind its machines (`asg_name`,
`node_autoscaler`: node_sources.py). What is left here is what every choice
shares: nodes, cordons, drains, spares' standbys, health, logs, preflight.

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
from .config import KubePoolSettings, KubeSettings
from .errors import classify, unanswered
from .informers import ClusterCache, shared
from .kinds import PYTORCHJOB, TRAINJOB
from .node_sources import NodeSource, node_source_for
from .observe import (
    CORDONED_BY_REGATTA,
    event_issues,
    lost_ranks,
    node_info,
    node_signals,
    pods_by_rank,
)
from .preflight import run_allreduce, run_dcgm_labels
from .pytorchjob_calls import PyTorchJobCalls
from .queues import queue_for
from .reads import CachedReads, LiveReads
from .resources import smallest_allocatable
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
        self.reads = CachedReads(self, cache) if cache is not None else LiveReads(self)
        # The parts: the queue, and the job APIs that consult it. New
        # attempts are made with `jobs`; an attempt is observed and stopped
        # by the kind its reference names (`job_api_of`), so attempts
        # launched before the setting changed are still found.
        self.queue = queue_for(settings.gang_scheduler, self.reads)
        self.job_apis = {PYTORCHJOB.name: PyTorchJobCalls(self, self.queue),
                         TRAINJOB.name: TrainJobCalls(self, self.queue)}
        self.jobs = self.job_apis[TRAINJOB.name if settings.job_api == "trainjob"
                                  else PYTORCHJOB.name]
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

    # --- nodes ----------------------------------------------------------------------
    def _pool_nodes(self, pool: PoolInfo) -> list[dict]:
        return self.reads.nodes(dict(pool.node_selector))

    def node_source(self, pool: PoolInfo) -> NodeSource:
        """The part that brings up the pool's machines (node_sources.py)."""
        return node_source_for(self, pool)

    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        nodes = [self.reads.derived("info", n, node_info) for n in self._pool_nodes(pool)]
        return nodes + self.node_source(pool).coming(pool, nodes)

    def provision_node(self, pool: PoolInfo, name: str) -> NodeInfo:
        return self.node_source(pool).provision(pool, name)

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
        """By the pool's node source (node_sources.py; docs/kubernetes.md,
        "replace"): never waits for the new machine."""
        return self.node_source(pool).replace(pool, node)

    def hold_spares(self, pool: PoolInfo, nodes: list[str]) -> None:
        """A standby pod on each of `nodes`, the pool's ready spares, and on
        no other node (capacity.py): the spare's GPUs held for Regatta and
        the trainer image kept on it."""
        if not self.settings.standbys or not self.node_source(pool).keeps_standbys:
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
        """The Auto Scaling group's account of the asks (aws_node_groups.py);
        Karpenter's capacity pods wait in their own pending state instead."""
        return self.node_source(pool).scaling_status(pool, since)

    def release(self, pool: PoolInfo, node: str, provider_id: str) -> str | None:
        return self.node_source(pool).release(pool, node, provider_id)

    # --- attempts -----------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> dict:
        return self.jobs.launch(request)

    def job_api_of(self, ref: dict):
        """The job-API part an attempt was made with, by its reference."""
        return self.job_apis[TRAINJOB.name if ref.get("kind") == TRAINJOB.name
                             else PYTORCHJOB.name]

    def _release_capacity(self, pool: PoolInfo, placed: set[str]) -> None:
        """Free the GPUs that capacity and standby pods hold on the placed
        nodes, before the training (or preflight) pods ask for them
        (capacity.py). A standby is found by the node it stands for, bound
        yet or not."""
        self.node_source(pool).free(pool, placed)
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
        return self.job_api_of(ref).observe(ref)

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
        self.job_api_of(ref).stop(ref, grace_s)

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


