"""A local fleet whose torch is still installing behind the running web
(clusters/providers/local/worker_env.py): its jobs wait in the queue with the
install's progress as their reason, the fleet page shows the same line, and
the first pass after the install admits them."""

import pytest
from django.utils import timezone

from clusters.providers.local import worker_env
from jobs.admission import admit
from jobs.models import Phase
from tests.fleet_helpers import later, submit, team_with_quota
from tests.frontend.conftest import login

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def installer(settings, tmp_path):
    settings.LOCAL_FLEET_DIR = tmp_path / "fleet"
    return worker_env.Installer(["true"], tmp_path / "fleet-env.log", say=print)


def test_jobs_wait_for_the_fleet_s_torch_with_its_progress_then_are_admitted(
        cluster, installer, operator):
    team = team_with_quota(cluster, gpus=4)
    now = timezone.now()
    job = submit(cluster, team, gpus=2, nodes=2)
    job.transition(Phase.QUEUED, reason="Queued", now=now)
    installer.write(state=worker_env.INSTALLING, done_bytes=1_200_000_000,
                    total_bytes=2_600_000_000, phase="downloading")

    report = admit(cluster.id, later(now, 1))

    job.refresh_from_db()
    assert report.admitted == [] and job.phase == Phase.QUEUED
    assert job.pending_reason == ("installing the fleet's torch: 1.2 / 2.6 GB; "
                                  "position 1 in queue")
    page = login(operator).get("/fleet/").content.decode()
    assert "installing the fleet&#x27;s torch: 1.2 / 2.6 GB" in page

    installer.write(state=worker_env.READY, done_bytes=2_600_000_000,
                    total_bytes=2_600_000_000)
    assert admit(cluster.id, later(now, 2)).admitted == [job.id]
    assert 'id="fleet-env-status"' not in login(operator).get("/fleet/").content.decode()


def test_a_failed_install_keeps_the_jobs_waiting_and_names_its_log(cluster, installer):
    team = team_with_quota(cluster, gpus=4)
    job = submit(cluster, team, gpus=2, nodes=2)
    job.transition(Phase.QUEUED, reason="Queued", now=timezone.now())
    installer.write(state=worker_env.FAILED, error="exit status 2")

    admit(cluster.id, timezone.now())

    job.refresh_from_db()
    assert job.phase == Phase.QUEUED
    assert "did not install (exit status 2)" in job.pending_reason
    assert str(installer.log) in job.pending_reason


def test_the_installer_reports_uv_s_download_bars_as_bytes_of_the_whole(installer):
    # Frames as uv 0.13 draws them on a terminal (colours, cursor moves),
    # cut at arbitrary points as a pseudo-terminal delivers them.
    frames = (
        "\x1b[2mscipy               \x1b[0m \x1b[32m\x1b[30m\x1b[2m------\x1b[0m\x1b[0m"
        "  16.00 MiB/34.24 MiB         \x1b[1A\r\x1b[2K\x1b[1B\r\x1b[2K"
        "\x1b[2mnumpy               \x1b[0m \x1b[32m---\x1b[0m   1.00 MiB/16.13 MiB   \r\n"
        "\x1b[2mscipy               \x1b[0m \x1b[32m------------\x1b[0m"
        "  34.24 MiB/34.24 MiB         \r\x1b[2K"
        "\x1b[2mnumpy               \x1b[0m \x1b[32m---\x1b[0m   8.00 MiB/16.13 MiB   \r\n")
    progress = worker_env.Progress()
    for i in range(0, len(frames), 37):
        progress.feed(frames[i:i + 37])
    assert progress.total == pytest.approx((34.24 + 16.13) * 2**20)
    assert progress.done == pytest.approx((34.24 + 8.00) * 2**20)
    assert not progress.linking
    progress.feed("\x1b[2mPrepared \x1b[1m2 packages\x1b[0m in 860ms\r\nInstalling wheels...\r\n")
    assert progress.linking and progress.done == progress.total
    assert worker_env.describe({"state": "installing", "done_bytes": progress.done,
                                "total_bytes": progress.total, "phase": "linking"}) == \
        "installing the fleet's torch: unpacking into the virtualenv"


def test_no_preflight_runs_and_no_node_is_blamed_while_the_fleet_s_torch_installs(
        installer, tmp_path):
    from clusters.providers.base import Placement
    from clusters.providers.local import LocalProvider
    from tests.support.local_fleet import make_pool

    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    pool = make_pool()
    nodes = [n.name for n in provider.list_nodes(pool)][:2]
    installer.write(state=worker_env.INSTALLING, done_bytes=5, total_bytes=10)

    result = provider.preflight(
        pool, tuple(Placement(node=n, node_rank=i) for i, n in enumerate(nodes)), 30.0)

    assert result.pending and not result.failed_nodes
    assert result.message.startswith("installing the fleet's torch")
    assert not (provider.root / "preflight").exists()
    provider.hold_spares(pool, nodes)  # no standby either
    assert not (provider.root / "standby").exists()
