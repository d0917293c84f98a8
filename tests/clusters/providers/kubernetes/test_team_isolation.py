"""What a rank on Kubernetes can reach of other teams' checkpoints: on a
shared volume only its job's folder is mounted; on S3 each team's pods run
as the team's own service account (an IAM role scoped to its prefix) once
the cluster names them."""

import pytest

from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes.config import KubeSettings
from controlplane.lib.errors import PermanentError

from .test_manifests import make_request, pod_spec

TEAMS = {"vision": "trainer-vision", "speech": "trainer-speech"}


def test_each_team_s_pods_run_as_its_own_service_account():
    settings = KubeSettings.parse({"service_account": "regatta-trainer",
                                   "team_service_accounts": TEAMS})
    for team, account in TEAMS.items():
        job = mf.to_dict(mf.pytorch_job(make_request(team=team), settings))
        assert {pod_spec(job, r)["serviceAccountName"] for r in ("Master", "Worker")} == {
            account}


def test_a_team_left_out_is_refused_not_given_the_shared_account():
    settings = KubeSettings.parse({"service_account": "regatta-trainer",
                                   "team_service_accounts": TEAMS})
    with pytest.raises(PermanentError, match="'robotics' has no service account"):
        mf.pytorch_job(make_request(team="robotics"), settings)


def test_without_per_team_accounts_every_team_shares_the_cluster_s_one():
    settings = KubeSettings.parse({"service_account": "regatta-trainer"})
    job = mf.to_dict(mf.pytorch_job(make_request(team="vision"), settings))
    assert pod_spec(job, "Master")["serviceAccountName"] == "regatta-trainer"


def test_the_preflight_which_reads_no_checkpoints_keeps_the_shared_account():
    settings = KubeSettings.parse({"service_account": "regatta-trainer",
                                   "team_service_accounts": TEAMS})
    request = make_request()
    job = mf.to_dict(mf.preflight_job(request.pool, request.placements, settings, nonce="a"))
    assert pod_spec(job, "Master")["serviceAccountName"] == "regatta-trainer"


def test_a_bad_per_team_setting_is_named():
    with pytest.raises(Exception, match="team_service_accounts"):
        KubeSettings.parse({"team_service_accounts": ["trainer-vision"]})
