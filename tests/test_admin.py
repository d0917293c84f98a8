"""The Django admin: every page renders for an admin, and its actions go
through the model transitions."""

import pytest
from django.urls import reverse

from clusters.models import Node
from jobs.models import JobEvent, TrainingJob


@pytest.fixture
def admin_client_(client, admin_user_):
    client.force_login(admin_user_)
    return client


@pytest.fixture
def resnet_job(team, cluster, owner):
    """Named so the admin's pages can be searched for it."""
    return TrainingJob.objects.create(
        name="resnet", team=team, cluster=cluster, pool=cluster.pools.get(), created_by=owner,
        num_nodes=1, gpus_per_node=2,
    )


@pytest.mark.parametrize("model", [
    "jobs/team", "jobs/quota", "jobs/trainingjob", "clusters/cluster", "clusters/nodepool",
    "clusters/node", "clusters/nodehealthevent", "checkpoints/checkpoint",
    "checkpoints/modelartifact", "accounts/apitoken",
])
def test_every_changelist_renders(admin_client_, resnet_job, model):
    response = admin_client_.get(f"/admin/{model}/")
    assert response.status_code == 200


def test_the_change_pages_render(admin_client_, resnet_job, team, cluster):
    for url in (
        reverse("admin:jobs_trainingjob_change", args=[resnet_job.pk]),
        reverse("admin:jobs_team_change", args=[team.pk]),
        reverse("admin:clusters_cluster_change", args=[cluster.pk]),
        reverse("admin:clusters_node_change", args=[cluster.nodes.first().pk]),
    ):
        assert admin_client_.get(url).status_code == 200, url


def test_the_quota_list_shows_gpus_in_use_against_the_limit(admin_client_, resnet_job):
    TrainingJob.objects.filter(pk=resnet_job.pk).update(phase="running")
    body = admin_client_.get("/admin/jobs/quota/").content.decode()
    assert "2 / 4" in body


def test_the_job_page_shows_spec_and_status_read_only(admin_client_, resnet_job):
    response = admin_client_.get(reverse("admin:jobs_trainingjob_change", args=[resnet_job.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    for field in ("phase", "num_nodes", "gpus_per_node", "hyperparameters", "storage_uri"):
        assert f'name="{field}"' not in body, field
    assert "resnet" in body


def test_jobs_cannot_be_added_in_the_admin(admin_client_, team, cluster):
    assert admin_client_.get(reverse("admin:jobs_trainingjob_add")).status_code == 403
    response = admin_client_.post(reverse("admin:jobs_trainingjob_add"), {
        "name": "sneaky", "team": team.pk, "cluster": cluster.pk, "num_nodes": 99,
        "gpus_per_node": 99, "image": "x", "strategy": "ddp", "checkpoint_policy": "steps",
        "checkpoint_every_steps": 1, "keep_last": 1, "priority": 0,
        "restart_budgets": "{}", "generation": 1,
    })
    assert response.status_code == 403
    assert not TrainingJob.objects.exists()
    assert not JobEvent.objects.exists()


def test_a_change_post_cannot_alter_the_spec(admin_client_, resnet_job):
    before = TrainingJob.objects.values().get(pk=resnet_job.pk)
    response = admin_client_.post(reverse("admin:jobs_trainingjob_change", args=[resnet_job.pk]), {
        "name": "renamed", "num_nodes": 64, "gpus_per_node": 8, "storage_uri": "/elsewhere",
        "hyperparameters": '{"model": "huge"}', "generation": 9, "phase": "succeeded",
    })
    assert response.status_code == 403
    assert TrainingJob.objects.values().get(pk=resnet_job.pk) == before
    assert not JobEvent.objects.exists()


def test_a_job_cannot_be_deleted_in_the_admin(admin_client_, resnet_job):
    url = reverse("admin:jobs_trainingjob_delete", args=[resnet_job.pk])
    assert admin_client_.post(url, {"post": "yes"}).status_code == 403
    assert TrainingJob.objects.filter(pk=resnet_job.pk).exists()


def test_a_staff_member_who_may_only_view_jobs_cannot_cancel_them(client, operator, resnet_job):
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    client.force_login(operator)
    assert client.get("/admin/jobs/trainingjob/").status_code == 200
    client.post("/admin/jobs/trainingjob/",
                {"action": "cancel", "_selected_action": [resnet_job.pk]})
    resnet_job.refresh_from_db()
    assert (resnet_job.phase, resnet_job.cancel_requested_at) == ("pending", None)
    assert not JobEvent.objects.exists()


def test_the_cancel_action_asks_the_job_to_stop_and_writes_an_event(admin_client_, resnet_job):
    response = admin_client_.post("/admin/jobs/trainingjob/", {
        "action": "cancel", "_selected_action": [resnet_job.pk],
    })
    assert response.status_code == 302
    resnet_job.refresh_from_db()
    assert resnet_job.phase == "cancelled"
    kinds = list(resnet_job.events.values_list("kind", flat=True))
    assert kinds == ["CancelRequested", "Cancelled"]


def test_the_cordon_action_cordons_and_records_who(admin_client_, cluster):
    node = cluster.nodes.filter(state="ready").first()
    admin_client_.post("/admin/clusters/node/", {"action": "cordon", "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED
    assert node.events.get().actor == "user:ada"
    admin_client_.post("/admin/clusters/node/", {"action": "uncordon",
                                                 "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.state == Node.State.READY


def test_a_teammate_without_staff_cannot_open_the_admin(client, owner):
    client.force_login(owner)
    response = client.get("/admin/jobs/trainingjob/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_fault_injection_from_the_admin_is_refused_off_the_local_provider(admin_client_, cluster):
    cluster.provider = "kubernetes"
    cluster.save()
    node = cluster.nodes.first()
    response = admin_client_.post("/admin/clusters/node/", {
        "action": "inject_kill", "_selected_action": [node.pk],
    }, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert any("fault injection needs a local cluster" in m for m in shown), shown
    assert not node.events.exists()


def test_the_replace_action_asks_for_a_replacement_once(admin_client_, cluster):
    node = cluster.nodes.filter(is_spare=False).first()
    for _ in range(2):
        admin_client_.post("/admin/clusters/node/", {"action": "replace",
                                                     "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.replace_requested_at is not None
    assert node.events.count() == 1
