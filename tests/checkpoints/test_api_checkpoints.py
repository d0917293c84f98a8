"""Checkpoints and exported models, scoped like their jobs."""

from checkpoints.models import ModelArtifact
from tests.api_factories import make_checkpoint, make_job


def test_a_member_reads_a_checkpoint_and_an_outsider_does_not(api, owner, outsider, team,
                                                              cluster):
    job = make_job(team, cluster, owner)
    checkpoint = make_checkpoint(job, 200)
    data = api(owner).get(f"/api/v1/checkpoints/{checkpoint.pk}/").data
    assert (data["job"], data["step"], data["state"]) == (job.pk, 200, "committed")
    assert api(outsider).get(f"/api/v1/checkpoints/{checkpoint.pk}/").status_code == 404
    assert api(outsider).get(f"/api/v1/jobs/{job.pk}/checkpoints/").status_code == 404


def test_artifacts_are_listed_per_team(api, owner, outsider, team, other_team, cluster):
    mine = make_job(team, cluster, owner)
    theirs = make_job(other_team, cluster, outsider)
    ModelArtifact.objects.create(job=mine, name="gpt-vision", uri="/tmp/a", bytes=10)
    other = ModelArtifact.objects.create(job=theirs, name="gpt-speech", uri="/tmp/b")
    data = api(owner).get("/api/v1/artifacts/").data["results"]
    assert [a["name"] for a in data] == ["gpt-vision"]
    assert api(owner).get(f"/api/v1/artifacts/?job={mine.pk}&count=true").data["count"] == 1
    assert api(owner).get(f"/api/v1/artifacts/{other.pk}/").status_code == 404
    assert api(outsider).get(f"/api/v1/artifacts/{other.pk}/").data["name"] == "gpt-speech"
