"""The launch's preflight on the local fleet: a real gloo all-reduce over one
torchrun per node, read through the provider protocol's one report shape
(clusters/providers/base.py: PreflightEvidence). The gang that starts runs the
local provider's test ranks, not the trainer, to keep the test short."""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodeHealthEvent, NodePool
from clusters.providers import get_provider, pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Phase
from tests.fleet_helpers import kinds, launch, submit, team_with_quota
from tests.support.local_fleet import RANKS_SCRIPT, kill_everything

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.usefixtures("fleet_dirs")]


@pytest.fixture
def lab_cluster(db, tmp_path):
    lab_cluster = Cluster.objects.create(
        name="lab", provider=Cluster.Provider.LOCAL,
        settings={"fleet_dir": str(tmp_path / "fleet"), "preflight": True,
                  "preflight_timeout_s": 90.0},
    )
    NodePool.objects.create(cluster=lab_cluster, name="cpu", gpus_per_node=1, size=2, spare_count=1)
    reconcile_cluster_unlocked(lab_cluster.id, timezone.now())
    try:
        yield lab_cluster
    finally:
        kill_everything(get_provider(lab_cluster).root)


def start(lab_cluster):
    job = submit(lab_cluster, team_with_quota(lab_cluster), gpus=1, entrypoint=[RANKS_SCRIPT])
    launch(job, timezone.now())
    job.refresh_from_db()
    return job


def test_a_local_gang_that_passes_preflight_records_its_bandwidth(lab_cluster):
    job = start(lab_cluster)

    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    passed = job.events.get(kind="PreflightPassed")
    gbps = passed.evidence["allreduce_gbps"]
    assert isinstance(gbps, float) and gbps > 0
    # The slowest node's figure, the one the attempt's report keeps too.
    per_node = attempt.preflight["per_node"]
    assert sorted(per_node) == sorted(passed.evidence["nodes"])
    assert gbps == min(n["busbw_gbps"] for n in per_node.values())
    assert attempt.preflight["allreduce_gbps"] == gbps


def test_a_local_node_that_fails_preflight_is_cordoned_with_the_failing_check(lab_cluster):
    first = Node.objects.filter(cluster=lab_cluster, is_spare=False).order_by("name").first()
    get_provider(lab_cluster).inject_fault(pool_info(first.pool), first.name, "preflight_fail")

    job = start(lab_cluster)

    first.refresh_from_db()
    assert first.state == Node.State.CORDONED
    health = first.health_events.get()
    assert health.kind == NodeHealthEvent.Kind.NCCL_TEST
    assert health.evidence["preflight"]["check"] == "self-test"
    assert "simulated hardware fault" in health.evidence["preflight"]["error"]
    failed = job.events.get(kind="PreflightFailed")
    assert failed.evidence["node"] == first.name
    assert failed.evidence["preflight"] == health.evidence["preflight"]
    # The spare took its place, passed, and the gang started without it.
    attempt = job.attempts.get()
    assert attempt.state == JobAttempt.State.STARTING
    assert first.name not in {p.node.name for p in attempt.placements.select_related("node")}
    assert kinds(job)[-3:] == ["NodeSwapped", "PreflightPassed", "Launched"]
    assert job.events.get(kind="PreflightPassed").evidence["allreduce_gbps"] > 0
