"""Every job file in examples/ is one the API accepts as it stands, after the
CLI's entrypoint resolution, on the demo world (`manage.py regatta_demo`:
team demo, cluster local, pool cpu), and every script it names exists."""

from pathlib import Path

import pytest
import yaml

from cli.main import resolve_entrypoint
from clusters.models import Cluster, NodePool
from jobs.models import Quota, Team, TrainingJob

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))


@pytest.fixture
def demo_world(db, django_user_model):
    cluster = Cluster.objects.create(name="local", provider=Cluster.Provider.LOCAL)
    NodePool.objects.create(cluster=cluster, name="cpu", gpus_per_node=1, size=4, spare_count=1)
    team = Team.objects.create(name="demo")
    Quota.objects.create(team=team, cluster=cluster, gpus=4)
    user = django_user_model.objects.create_user("demo-user", password="x")
    team.members.add(user)
    return user


def test_there_are_example_job_files():
    assert len(FILES) >= 5


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_example_is_accepted_and_its_script_exists(demo_world, api, path):
    spec = yaml.safe_load(path.read_text())
    resolve_entrypoint(spec, path.parent)
    for item in spec.get("entrypoint", []):
        if item.endswith(".py"):
            assert Path(item).is_absolute() and Path(item).is_file(), item

    resp = api(demo_world).post("/api/v1/jobs/", spec, format="json")

    assert resp.status_code == 201, resp.content
    job = TrainingJob.objects.get(pk=resp.data["id"])
    expected = "exit" if spec.get("entrypoint") else "checkpoint"
    assert job.completion == spec.get("completion", expected)
