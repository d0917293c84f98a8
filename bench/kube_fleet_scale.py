"""Regatta on a fleet of kwok nodes on the real test cluster (testcluster/),
in one run: nodes joined and Ready; the API server's requests from Regatta
per minute on a quiet fleet at two fleet sizes (`--small`, then `--nodes`);
a cluster reconcile pass's time (p50/p95) with the provider reading through
informers beside the same passes listing every time (the baseline); then
admissions per second over queued jobs, and the worker's memory.

    .venv/bin/python bench/kube_fleet_scale.py [--nodes 5000] [--small 1000]
        [--jobs 1000] [--quiet-s 60] [--state DIR]

The API server counts Regatta's requests itself: a FlowSchema matches
Regatta's ServiceAccount (deploy/'s), and its
`apiserver_flowcontrol_dispatched_requests_total{flow_schema="regatta"}`
is read from /metrics before and after each phase. Nodes are kwok's (no
kubelet, no containers): 8 GPUs each, the labels of an EKS p5 node group.
Uses its own state folders (cluster, SQLite + embedded Redis); stops the
cluster at the end. Prints what else ran on the machine (the load average
and the busiest processes) at the start and the end, since the figures
depend on it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import ssl
import statistics
import subprocess
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


def busiest(count: int = 8) -> list[str]:
    """The processes using the most CPU now, as `ps` shows them."""
    out = subprocess.run(["ps", "-eo", "pcpu,rss,etime,args", "--sort=-pcpu"],
                         capture_output=True, text=True, check=False).stdout.splitlines()
    return [line[:160] for line in out[1:count + 1]]


def main() -> None:  # noqa: C901, PLR0915 - one measured run, in order
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--small", type=int, default=0,
                        help="the first, smaller fleet's size (default: a fifth of --nodes)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--baseline-passes", type=int, default=5)
    parser.add_argument("--quiet-s", type=float, default=60.0)
    parser.add_argument("--state", type=Path, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="print where one informer pass at the full size spends its time")
    args = parser.parse_args()
    small = args.small or max(1, args.nodes // 5)

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
    def say(*lines: str) -> None:
        """A figure, printed as it comes (a long run that fails keeps them)."""
        print("\n".join(lines), flush=True)

    say(f"started {time.strftime('%Y-%m-%d %H:%M:%S')}, load average "
        + " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "busiest processes at the start (%CPU RSS-KiB elapsed command):",
        *(f"  {line}" for line in busiest()))
    try:
        t0 = time.perf_counter()
        cluster_proc.up(log=lambda line: None)
        say(f"cluster up: {time.perf_counter() - t0:.1f} s")
        admin = bootstrap.api_client(cluster_proc.admin_kubeconfig)
        bootstrap.apply(admin, [flow_schema()])
        kubeconfig = bootstrap.regatta_kubeconfig(cluster_proc)
        admin_token = cluster_proc._tokens()["admin"]
        core = k8s.CoreV1Api(admin)
        pool = Pool("h100", size=args.nodes)

        def ready_count() -> int:
            nodes = core.list_node(label_selector="eks.amazonaws.com/nodegroup=h100",
                                   _preload_content=False, _request_timeout=120)
            items = json.loads(nodes.data)["items"]
            return sum(1 for n in items if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (n.get("status") or {}).get("conditions") or []))

        def grow(to: int, since: int) -> None:
            t1 = time.perf_counter()
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: core.create_node(node_manifest(pool, i)), range(since, to)))
            created = time.perf_counter() - t1
            while ready_count() < to:
                if time.perf_counter() - t1 > 3600:
                    raise SystemExit(f"{to} nodes not Ready within an hour")
                time.sleep(5)
            say(f"nodes {since} -> {to} (8 GPUs each): created in {created:.1f} s "
                       f"({(to - since) / created:.0f}/s), all {to} Ready "
                       f"{time.perf_counter() - t1:.1f} s after the first create")

        def passes(count: int) -> list[float]:
            times = []
            for _ in range(count):
                t1 = time.perf_counter()
                reconcile_cluster_unlocked(row.id, timezone.now())
                times.append(time.perf_counter() - t1)
            return times

        def quiet(size: int) -> float:
            """Regatta's requests per minute over a quiet fleet: a pass every
            5 s, as the beat's sweep would run them."""
            passes(2)  # whatever the last change left to do
            start = regatta_requests(cluster_proc, admin_token)
            t1 = time.perf_counter()
            count = 0
            while time.perf_counter() - t1 < args.quiet_s:
                reconcile_cluster_unlocked(row.id, timezone.now())
                count += 1
                time.sleep(5)
            wall = time.perf_counter() - t1
            made = regatta_requests(cluster_proc, admin_token) - start
            rate = made / wall * 60
            say(f"quiet fleet of {size} nodes, a pass every 5 s for {wall:.0f} s "
                       f"({count} passes): {made:.0f} requests from Regatta, {rate:.1f}/min")
            return rate

        def summary(what: str, times: list[float]) -> str:
            return (f"{what} ({len(times)} passes): p50 {statistics.median(times):.3f} s, "
                    f"p95 {pct(times, 0.95):.3f} s, max {max(times):.3f} s")

        # --- the smaller fleet ---------------------------------------------------------
        grow(small, 0)
        row = Cluster.objects.create(
            name="kwok-fleet", provider=Cluster.Provider.KUBERNETES,
            settings={"kubeconfig": str(kubeconfig), "namespace": "regatta-training",
                      "request_timeout_s": 30, "preflight": "dcgm-labels",
                      "health_labels": {}})
        pool_row = NodePool.objects.create(
            cluster=row, name="h100", instance_type=pool.instance_type, gpus_per_node=8,
            size=small, spare_count=0, node_selector=pool.selector)
        rss_before = rss_mib()
        t1 = time.perf_counter()
        reconcile_cluster_unlocked(row.id, timezone.now())  # lists, makes the node rows
        say(f"first cluster pass at {small} nodes (lists them, makes their rows): "
                   f"{time.perf_counter() - t1:.2f} s")
        quiet_small = quiet(small)
        rss_small = rss_mib()

        # --- the full fleet --------------------------------------------------------------
        grow(args.nodes, small)
        NodePool.objects.filter(pk=pool_row.pk).update(size=args.nodes)
        t1 = time.perf_counter()
        reconcile_cluster_unlocked(row.id, timezone.now())  # the new rows
        say(f"first cluster pass at {args.nodes} nodes (their rows made): "
                   f"{time.perf_counter() - t1:.2f} s")
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
        say(summary(f"cluster pass at {args.nodes} nodes, listing every pass "
                           "(the baseline)", base_times)
                   + f"; {base_requests:.0f} requests, "
                   f"{base_requests / len(base_times):.1f} per pass, "
                   f"{base_requests / base_wall * 60:.0f}/min back to back")
        informer_times = passes(args.passes)
        say(summary(f"cluster pass at {args.nodes} nodes, informers", informer_times))
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(reconcile_cluster_unlocked, row.id, timezone.now())
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
            say(text.getvalue())
        quiet_full = quiet(args.nodes)
        rss_full = rss_mib()
        say(f"requests/min on a quiet fleet: {quiet_small:.1f} at {small} nodes, "
                   f"{quiet_full:.1f} at {args.nodes} nodes")

        # --- admission: one-node jobs queued across teams --------------------------------
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
        say(f"admission: {admitted} of {args.jobs} one-node jobs in {admit_s:.2f} s, "
                   f"{admitted / admit_s:.0f} admissions/s")
        load = os.getloadavg()
        say(
            f"worker memory (RSS): {rss_before:.0f} MiB before any pass, {rss_small:.0f} MiB "
            f"with the informers at {small} nodes, {rss_full:.0f} MiB at {args.nodes}",
            f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}; "
            f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
            "busiest processes at the end:", *(f"  {line}" for line in busiest()),
        )
    finally:
        stop_all()
        cluster_proc.down()
        if redis_proc is not None:
            redis_proc.terminate()


if __name__ == "__main__":
    main()
