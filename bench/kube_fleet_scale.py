"""Regatta on a fleet of kwok nodes on the real test cluster (testcluster/):
nodes joined and healthy, a cluster reconcile pass's time (p50/p95) and the
API server's requests from Regatta per minute, with the provider reading
through informers beside the same passes listing every time (the baseline),
then admissions per second over queued jobs, and the worker's memory.

    .venv/bin/python bench/kube_fleet_scale.py [--nodes 5000] [--jobs 1000]
        [--quiet-s 60] [--state DIR]

The API server counts Regatta's requests itself: a FlowSchema matches
Regatta's ServiceAccount (deploy/'s), and its
`apiserver_flowcontrol_dispatched_requests_total{flow_schema="regatta"}`
is read from /metrics before and after each phase. Nodes are kwok's (no
kubelet, no containers): 8 GPUs each, the labels of an EKS p5 node group.
Uses its own state folders (cluster, SQLite + embedded Redis); stops the
cluster at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLOW = "regatta"


def regatta_requests(cluster, token: str) -> float:
    ctx = ssl.create_default_context(cafile=str(cluster.state / "pki" / "ca.crt"))
    req = urllib.request.Request(cluster.endpoints().api_url + "/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{") and \
                f'flow_schema="{FLOW}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def flow_schema() -> dict:
    return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": FLOW},
            "spec": {"priorityLevelConfiguration": {"name": "workload-high"},
                     "matchingPrecedence": 100,
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                         "name": "regatta-control-plane", "namespace": "regatta"}}],
                         "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                            "resources": ["*"], "clusterScope": True,
                                            "namespaces": ["*"]}],
                         "nonResourceRules": [{"verbs": ["*"],
                                               "nonResourceURLs": ["*"]}]}]}}


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:  # noqa: C901, PLR0915 - one measured run, in order
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--baseline-passes", type=int, default=5)
    parser.add_argument("--quiet-s", type=float, default=60.0)
    parser.add_argument("--state", type=Path, default=None)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    os.environ.setdefault("REGATTA_STATE_DIR", tempfile.mkdtemp(prefix="regatta-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone
    from kubernetes import client as k8s

    from clusters.models import Cluster, Node, NodePool
    from clusters.providers.kubernetes import client as kube_client
    from clusters.providers.kubernetes.informers import stop_all
    from clusters.reconcile import reconcile_cluster_unlocked
    from controlplane.embedded import start_redis
    from jobs import admission
    from jobs.models import Phase, Quota, Team, TrainingJob
    from testcluster import bootstrap, build
    from testcluster.cluster import TestCluster
    from testcluster.fleet import Pool, node_manifest

    state = args.state or Path(tempfile.mkdtemp(prefix="regatta-kube-bench-"))
    cluster_proc = TestCluster(state, build.bin_dir())
    redis_proc = start_redis(settings.EMBEDDED_REDIS_SOCKET) if settings.EMBEDDED_REDIS else None
    call_command("migrate", verbosity=0)
    out: list[str] = []
    try:
        t0 = time.perf_counter()
        cluster_proc.up(log=lambda line: None)
        up_s = time.perf_counter() - t0
        admin = bootstrap.api_client(cluster_proc.admin_kubeconfig)
        bootstrap.apply(admin, [flow_schema()])
        kubeconfig = bootstrap.regatta_kubeconfig(cluster_proc)
        admin_token = cluster_proc._tokens()["admin"]
        core = k8s.CoreV1Api(admin)

        pool = Pool("h100", size=args.nodes)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: core.create_node(node_manifest(pool, i)), range(args.nodes)))
        created_s = time.perf_counter() - t0

        def ready_count() -> int:
            nodes = core.list_node(label_selector="eks.amazonaws.com/nodegroup=h100",
                                   _preload_content=False)
            items = json.loads(nodes.data)["items"]
            return sum(1 for n in items if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (n.get("status") or {}).get("conditions") or []))

        while ready_count() < args.nodes:
            if time.perf_counter() - t0 > 1800:
                raise SystemExit("nodes not ready within 30 minutes")
            time.sleep(2)
        healthy_s = time.perf_counter() - t0

        row = Cluster.objects.create(
            name="kwok-fleet", provider=Cluster.Provider.KUBERNETES,
            settings={"kubeconfig": str(kubeconfig), "namespace": "regatta-training",
                      "request_timeout_s": 30, "preflight": "dcgm-labels",
                      "health_labels": {}})
        NodePool.objects.create(cluster=row, name="h100", instance_type=pool.instance_type,
                                gpus_per_node=8, size=args.nodes, spare_count=0,
                                node_selector=pool.selector)
        rss_before = rss_mib()

        def passes(count: int) -> list[float]:
            times = []
            for _ in range(count):
                t1 = time.perf_counter()
                reconcile_cluster_unlocked(row.id, timezone.now())
                times.append(time.perf_counter() - t1)
            return times

        t1 = time.perf_counter()
        reconcile_cluster_unlocked(row.id, timezone.now())  # makes the node rows
        first_s = time.perf_counter() - t1
        assert Node.objects.filter(cluster=row).count() == args.nodes

        # Baseline: the same passes, every read a request (no informers).
        made = kube_client.KubernetesProvider.for_cluster.__func__
        live = classmethod(lambda cls, name, s: cls(kube_client.api_client_for(s), s))
        kube_client.KubernetesProvider.for_cluster = live
        before = regatta_requests(cluster_proc, admin_token)
        t1 = time.perf_counter()
        base_times = passes(args.baseline_passes)
        base_wall = time.perf_counter() - t1
        base_requests = regatta_requests(cluster_proc, admin_token) - before
        kube_client.KubernetesProvider.for_cluster = classmethod(made)

        # Informers: the first pass lists, the rest read the cache.
        before = regatta_requests(cluster_proc, admin_token)
        informer_times = passes(args.passes)
        # A quiet fleet: a pass every 5 s, as the beat's sweep would.
        quiet_from = regatta_requests(cluster_proc, admin_token)
        t1 = time.perf_counter()
        quiet_passes = 0
        while time.perf_counter() - t1 < args.quiet_s:
            reconcile_cluster_unlocked(row.id, timezone.now())
            quiet_passes += 1
            time.sleep(5)
        quiet_wall = time.perf_counter() - t1
        quiet_requests = regatta_requests(cluster_proc, admin_token) - quiet_from
        rss_after = rss_mib()

        # Admission: one-node jobs queued across teams.
        teams = [Team.objects.create(name=f"team-{i}") for i in range(10)]
        for team in teams:
            Quota.objects.create(team=team, cluster=row, gpus=args.nodes * 8,
                                 max_running_jobs=args.jobs)
        now = timezone.now()
        TrainingJob.objects.bulk_create([
            TrainingJob(name=f"j{i}", team=teams[i % len(teams)], cluster=row, num_nodes=1,
                        gpus_per_node=8, phase=Phase.QUEUED, created_at=now,
                        phase_changed_at=now, observed_generation=1)
            for i in range(args.jobs)], batch_size=500)
        t1 = time.perf_counter()
        admission.admit(row.id, timezone.now())
        admit_s = time.perf_counter() - t1
        admitted = TrainingJob.objects.filter(cluster=row, phase=Phase.ADMITTED).count()

        load = os.getloadavg()
        out += [
            f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
            f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
            f"cluster up: {up_s:.1f} s",
            f"nodes: {args.nodes} of 8 GPUs; created in {created_s:.1f} s, all Ready "
            f"{healthy_s:.1f} s after the first create",
            f"first cluster pass (makes {args.nodes} node rows): {first_s:.2f} s",
            f"cluster pass, listing (baseline, {len(base_times)} passes): p50 "
            f"{statistics.median(base_times):.2f} s, p95 {pct(base_times, 0.95):.2f} s; "
            f"{base_requests:.0f} requests, {base_requests / len(base_times):.1f} per pass, "
            f"{base_requests / base_wall * 60:.0f}/min back to back",
            f"cluster pass, informers ({len(informer_times)} passes, the first lists): p50 "
            f"{statistics.median(informer_times):.2f} s, p95 {pct(informer_times, 0.95):.2f} s,"
            f" max {max(informer_times):.2f} s",
            f"quiet fleet, a pass every 5 s for {quiet_wall:.0f} s ({quiet_passes} passes): "
            f"{quiet_requests:.0f} requests from Regatta, "
            f"{quiet_requests / quiet_wall * 60:.1f}/min",
            f"admission: {admitted} of {args.jobs} jobs in {admit_s:.2f} s, "
            f"{admitted / admit_s:.0f} admissions/s",
            f"worker memory (RSS): {rss_before:.0f} MiB before the informers, "
            f"{rss_after:.0f} MiB with them",
        ]
    finally:
        stop_all()
        cluster_proc.down()
        if redis_proc is not None:
            redis_proc.terminate()
    print("\n".join(out))


if __name__ == "__main__":
    main()
