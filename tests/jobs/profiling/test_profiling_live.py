"""The issue's test, end to end over real HTTP: a person asks a running job
for a profile through the API; the two real gloo ranks of the job (torchrun,
the SDK program of tests/worker_image) get the directive from the live
control plane, each writes its trace into the job's storage and reports it;
each trace downloads for the job's team as gzipped JSON that `json.load`s,
and is not found for another team."""

import gzip
import json

import pytest

from jobs.profiling.models import ProfileTrace
from tests.api_factories import make_attempt, make_job
from tests.conftest import client_for
from tests.support.waiting import eventually
from tests.worker_image.test_sdk import Program


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_a_profile_yields_a_trace_per_rank_downloadable_only_by_the_team(
        live_server, team, cluster, owner, outsider, fleet_dirs, tmp_path):
    ckpt = fleet_dirs / "checkpoints" / "vision" / "profiled"
    job = make_job(team, cluster, owner, phase="running", storage_uri=str(ckpt))
    attempt, token = make_attempt(job)
    asked = client_for(owner).post(f"/api/v1/jobs/{job.pk}/profile/", {"steps": 3},
                                   format="json")
    assert asked.status_code == 202, asked.content
    env = {"REGATTA_URL": live_server.url, "REGATTA_TOKEN": token,
           "REGATTA_JOB_ID": str(job.pk), "REGATTA_ATTEMPT_ID": str(attempt.pk),
           "REGATTA_NODE": "cpu-a-0"}

    run = Program(tmp_path, "live", ckpt, steps=40, sleep=0.05, every=0, env=env).wait()

    assert run.exit_codes() == {0: 0, 1: 0}, run.log()[-3000:]
    eventually(lambda: ProfileTrace.objects.filter(job=job).count() == 2, timeout=20,
               interval=0.2, what="a trace per rank")
    listing = client_for(owner).get(f"/api/v1/jobs/{job.pk}/profiles/").json()["results"]
    assert sorted(t["rank"] for t in listing) == [0, 1]
    assert {(t["request_id"], t["steps"]) for t in listing} == {(asked.json()["request_id"], 3)}
    assert len({t["start_step"] for t in listing}) == 1
    for t in listing:
        resp = client_for(owner).get(t["url"])
        assert resp.status_code == 200
        trace = json.loads(gzip.decompress(b"".join(resp.streaming_content)))
        assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])
        assert client_for(outsider).get(t["url"]).status_code == 404
