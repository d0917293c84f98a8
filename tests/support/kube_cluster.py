"""A real Kubernetes control plane for the suite (testcluster/), started
once per test session by the first test that uses it and stopped after the
last, in the suite's state folder on free loopback ports.

`kube` starts etcd, kube-apiserver (Node,RBAC, ServiceAccount tokens),
kube-scheduler, kube-controller-manager, kwok, the Kubeflow
training-operator, and Kubeflow Trainer v2 with the JobSet controller and
their webhooks; applies deploy/ (its RBAC for real, its workloads
validated with a server-side dry run, deploy/trainjob's runtime through the
Trainer's webhook); and yields a KubeWorld holding a
kubeconfig with the token of deploy/'s ServiceAccount, so the provider has
exactly the rights deploy/ grants. `kube_world` gives each test its own
GPU pool of kwok nodes and removes it, and whatever ran in the training
namespace, afterwards.

Loaded as a plugin (pyproject's addopts). Where Go is missing, the tests
that use the cluster are left out with one line saying how to enable them,
unless CI=true: CI must never skip them, so there they fail.

The tests that use the cluster run last. `make test` may have started a
cold build of its binaries in the background (tens of minutes): the rest
of the suite runs meanwhile, and the first real-cluster test waits for it,
before pytest-timeout's clock for that test starts.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings
from kubernetes import client as k8s

from clusters.providers.kubernetes import informers
from clusters.providers.kubernetes.informers import stop_all
from controlplane.lib.errors import TemporaryError
from testcluster import bootstrap, build, kueue
from testcluster.cluster import TestCluster
from testcluster.fleet import Fleet, Pool
from tests.support.waiting import eventually

TRAINING_NS = "regatta-training"
# A shared file system for checkpoints, statically provisioned the way FSx
# for Lustre or EFS is: a PersistentVolume and a claim bound to it by the
# controller-manager. Nothing mounts it (kwok runs no containers); the
# control plane reads the checkpoints at the same path on this machine.
CHECKPOINT_PVC = "fsx-lustre"
_pool_names = itertools.count(1)


@dataclass
class KubeWorld:
    cluster: TestCluster
    admin: k8s.ApiClient
    regatta_kubeconfig: Path
    fleet: Fleet
    made_nodes: list[str] = field(default_factory=list)
    made_queues: list[dict] = field(default_factory=list)

    def make_pool(self, size: int = 3, **kw) -> Pool:
        """A pool of kwok GPU nodes of its own, ready; removed after the test."""
        pool = Pool(name=f"gpu{next(_pool_names)}", size=size, **kw)
        names = self.fleet.add(pool)
        self.made_nodes.extend(names)
        eventually(lambda: all(self.fleet.ready(n) for n in names), timeout=30, interval=0.1,
                   what=f"kwok to make {pool.name}'s nodes ready")
        # A new Node carries node.kubernetes.io/not-ready until the node
        # lifecycle controller sees it Ready; a pod scheduled before then is
        # refused for the taint, not for what the test arranged.
        eventually(lambda: not any(self._not_ready_taint(n) for n in names), timeout=30,
                   interval=0.1, what=f"the not-ready taint to leave {pool.name}'s nodes")
        return pool

    def make_queue(self, pool: Pool, gpus: int) -> str:
        """Kueue's ResourceFlavor for the pool's nodes, a ClusterQueue with
        `gpus` of it (and CPU and memory to spare), and a LocalQueue in the
        training namespace; returns the LocalQueue's name. Removed after the
        test."""
        docs = kueue.queues(TRAINING_NS, f"q-{pool.name}", pool.name,
                            {"nvidia.com/gpu": gpus, "cpu": 1000, "memory": "100Ti"},
                            pool.selector)
        bootstrap.apply(self.admin, docs)
        self.made_queues.extend(docs)
        return docs[-1]["metadata"]["name"]

    def workloads(self, namespace: str = TRAINING_NS) -> list[dict]:
        return self.custom.list_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, "workloads")["items"]

    def remove_queues(self) -> None:
        """The queues a test made, LocalQueue first; each is held by a
        finalizer until no Workload uses it, so this follows clean_namespace."""
        for doc in reversed(self.made_queues):
            name, ns = doc["metadata"]["name"], doc["metadata"].get("namespace")
            plural = doc["kind"].lower() + "s"
            args = (kueue.GROUP, kueue.VERSION, ns, plural, name) if ns else (
                kueue.GROUP, kueue.VERSION, plural, name)
            delete = (self.custom.delete_namespaced_custom_object if ns
                      else self.custom.delete_cluster_custom_object)
            try:
                delete(*args)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
            eventually(lambda a=args, n=ns: self._gone(a, n), timeout=30, interval=0.2,
                       what=f"{doc['kind']} {name} to go")
        self.made_queues.clear()

    def _gone(self, args, namespaced) -> bool:
        get = (self.custom.get_namespaced_custom_object if namespaced
               else self.custom.get_cluster_custom_object)
        try:
            get(*args)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    def _not_ready_taint(self, name: str) -> bool:
        taints = self.core.read_node(name).spec.taints or []
        return any(t.key == "node.kubernetes.io/not-ready" for t in taints)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.admin)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.admin)

    def pods(self, selector: str, namespace: str = TRAINING_NS) -> list[k8s.V1Pod]:
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def pytorchjob(self, name: str, namespace: str = TRAINING_NS) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(
                "kubeflow.org", "v1", namespace, "pytorchjobs", name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def trainjob(self, name: str, namespace: str = TRAINING_NS) -> dict | None:
        return self._custom_or_none("trainer.kubeflow.org", "v1alpha1", namespace,
                                    "trainjobs", name)

    def jobset(self, name: str, namespace: str = TRAINING_NS) -> dict | None:
        return self._custom_or_none("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name)

    def _custom_or_none(self, *args) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(*args)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _owners_gone(self, namespace: str) -> bool:
        """No TrainJob, JobSet or Job left: nothing that would make pods again."""
        return not any((
            self.custom.list_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")["items"],
            self.custom.list_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")["items"],
            k8s.BatchV1Api(self.admin).list_namespaced_job(namespace).items))

    def _force_delete_orphans(self, namespace: str) -> None:
        """Pods bound to a node the test deleted: no kubelet (nor kwok) will
        finish their graceful delete, and the controller-manager's pod GC
        takes them only after its 40 s quarantine of orphans. With their node
        gone nothing races a forced delete."""
        nodes = {n.metadata.name for n in self.core.list_node().items}
        for pod in self.core.list_namespaced_pod(namespace).items:
            if pod.spec.node_name and pod.spec.node_name not in nodes:
                try:
                    self.core.delete_namespaced_pod(pod.metadata.name, namespace,
                                                    grace_period_seconds=0)
                except k8s.ApiException as exc:
                    if exc.status != 404:
                        raise

    def clean_namespace(self, namespace: str = TRAINING_NS, timeout: float = 60) -> None:
        """Deletes every PyTorchJob, pod and Secret a test left, and waits
        until they are gone (kwok's pod-delete stage finishes the pods, the
        garbage collector the jobs): the next test's job may have the same
        name, since its database starts over."""
        self.custom.delete_collection_namespaced_custom_object(
            "kubeflow.org", "v1", namespace, "pytorchjobs")
        # A TrainJob's JobSet and Jobs go by garbage collection; until they
        # have, a Job might make a pod deleted below again.
        self.custom.delete_collection_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")
        eventually(lambda: self._owners_gone(namespace), timeout=timeout, interval=0.2,
                   what=f"the TrainJobs of {namespace} and what they made to go")
        # With their grace period, as a kubelet would see it: kwok's pod-delete
        # stage then removes them at once. Deleting them with none races that
        # stage, whose failed delete kwok retries a minute later under the
        # pod's name, which the next test's pod may by then carry.
        self.core.delete_collection_namespaced_pod(namespace)
        self._force_delete_orphans(namespace)
        self.core.delete_collection_namespaced_secret(namespace)
        k8s.PolicyV1Api(self.admin).delete_collection_namespaced_pod_disruption_budget(namespace)
        eventually(lambda: not self.core.list_namespaced_pod(namespace).items and not
                   self.custom.list_namespaced_custom_object(
                       "kubeflow.org", "v1", namespace, "pytorchjobs")["items"],
                   timeout=timeout, interval=0.2, what=f"the pods and jobs of {namespace} to go")


def seen_by_informers(world: KubeWorld, kind: str, written) -> None:
    """Until every `kind` informer ("nodes", "pods") this process started on
    the test cluster that holds the object `written` (as the API server gave
    it back to a test's write) holds that version of it or a newer one. A
    pass reads those shared caches, which a watch fills a moment after the
    write: a pass run at once may judge the object as it was. (An informer
    that does not hold the object, or whose watch is broken, is not waited
    for: a pass would not read the object from it.)"""
    meta = written.metadata
    version = int(meta.resource_version)
    host = world.admin.configuration.host
    started = [cache.started().get(kind) for cache in list(informers._caches.values())
               if cache.api.configuration.host == host]

    def holds(informer) -> bool:
        try:
            cached = informer.get(meta.namespace or "", meta.name)
        except TemporaryError:
            return True
        if cached is None:
            return True
        return int((cached.get("metadata") or {}).get("resourceVersion") or 0) >= version

    for informer in started:
        if informer is not None and informer.alive:
            eventually(lambda informer=informer: holds(informer), timeout=10, interval=0.05,
                       what=f"the {kind} informer to see {meta.name} at {version}")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


# How long the first real-cluster test waits for a background build.
BUILD_WAIT_S = 90 * 60


def _why_unavailable() -> str | None:
    """Why the cluster cannot start here, or None. Binaries are built by
    `make test` (in the background, see the module's docstring) or `make
    kube-build`, never inside a test."""
    if build.go_binary() is None:
        return build.ENABLE_HINT
    folder = build.bin_dir()
    if build.binaries_present(folder):
        return None
    if build.building_now(folder):
        return None  # the first real-cluster test waits for it
    log = build.build_log(folder)
    if log.exists() and log.stat().st_size:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        return f"the test cluster's build failed (log {log}):\n{tail}"
    return ("the test cluster is not built: run `make kube-build` (tens of minutes the "
            "first time) to enable the real-cluster tests")


def _uses_cluster(item) -> bool:
    return "kube" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The real-cluster tests go last (after pytest-django's own ordering),
    so a build in the background overlaps everything else. Where the
    cluster cannot start they are left out, said once at the end of the
    run; never in CI, where they fail."""
    items[:] = [i for i in items if not _uses_cluster(i)] + [i for i in items if _uses_cluster(i)]
    reason = _why_unavailable()
    if reason is None or _in_ci():
        return
    left_out = [item for item in items if _uses_cluster(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
        config._kube_left_out = (len(left_out), reason)


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Outside every other wrapper of the test (pytest-timeout's clock
    included): a real-cluster test waits here while its binaries build."""
    if _uses_cluster(item) and build.go_binary() is not None:
        folder = build.bin_dir()
        if not build.binaries_present(folder) and build.building_now(folder):
            reporter = item.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"waiting for the test cluster's build (log "
                                    f"{build.build_log(folder)})")
            build.wait_while_building(BUILD_WAIT_S, folder)
    return (yield)


def pytest_terminal_summary(terminalreporter, config):
    left_out = getattr(config, "_kube_left_out", None)
    if left_out:
        count, reason = left_out
        terminalreporter.write_line(f"{count} real-cluster tests skipped: {reason}",
                                    yellow=True)


def _shared_file_system(core: k8s.CoreV1Api) -> None:
    core.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": CHECKPOINT_PVC},
        "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "nfs": {"server": "fs-0123.fsx.us-east-1.amazonaws.com", "path": "/"}}})
    core.create_namespaced_persistent_volume_claim(TRAINING_NS, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CHECKPOINT_PVC},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "volumeName": CHECKPOINT_PVC, "resources": {"requests": {"storage": "1200Gi"}}}})
    eventually(lambda: core.read_namespaced_persistent_volume_claim(
        CHECKPOINT_PVC, TRAINING_NS).status.phase == "Bound", timeout=30, interval=0.2,
        what="the checkpoint claim to bind")


# The cluster, once started: the first test that asks for it starts it, and
# it stops as soon as the next test on this worker is not one of its group
# (pytest_runtest_teardown). Its tests run together (the group is one
# pytest-xdist scope, and last without xdist), so it starts once; idle, its
# nine processes would otherwise spend CPU for the rest of the session.
_running: list[KubeWorld] = []


def _start() -> KubeWorld:
    reason = _why_unavailable()
    if reason is not None:
        pytest.fail(f"CI must run the real-cluster tests: {reason}", pytrace=False)
    bin_dir = build.bin_dir()
    state = Path(settings.STATE_DIR) / "kube"
    cluster = TestCluster(state, bin_dir)
    cluster.up(log=lambda line: None)
    try:
        admin = bootstrap.api_client(cluster.admin_kubeconfig)
        world = KubeWorld(cluster=cluster, admin=admin,
                          regatta_kubeconfig=bootstrap.regatta_kubeconfig(cluster),
                          fleet=Fleet(admin))
        _shared_file_system(world.core)
    except BaseException:
        cluster.down()
        raise
    return world


def _stop() -> None:
    if not _running:
        return
    world = _running.pop()
    # The informers a provider made for it (for_cluster) stop first:
    # they would otherwise ask the stopped server until the process ends.
    stop_all()
    world.cluster.down()


@pytest.fixture
def kube() -> KubeWorld:
    """The session's cluster (started by the first test of its group)."""
    if not _running:
        _running.append(_start())
    return _running[0]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if _running and (nextitem is None or not _uses_cluster(nextitem)):
        _stop()


def pytest_sessionfinish(session):
    _stop()


@pytest.fixture
def kube_world(kube):
    """The session's cluster; after the test, an empty training namespace
    and none of the nodes the test made."""
    yield kube
    kube.clean_namespace()
    kube.remove_queues()
    for name in kube.made_nodes:
        try:
            kube.core.delete_node(name)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
    kube.made_nodes.clear()
