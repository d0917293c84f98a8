from django.test import Client

from jobs.goodput.models import GoodputEntry
from jobs.models import JobAttempt, JobEvent, Phase, TrainingJob

from .factories import checkpoint, goodput, make_job, rich_job, run


def test_a_member_sees_only_the_teams_jobs(web, owner, team, other_team, cluster):
    make_job(team, cluster, name="ours")
    make_job(other_team, cluster, name="theirs")
    resp = web(owner).get("/jobs/")
    assert [j.name for j in resp.context["jobs"]] == ["ours"]
    assert "theirs" not in resp.content.decode()


def test_an_operator_sees_every_team_s_jobs(web, operator, team, other_team, cluster):
    make_job(team, cluster, name="ours")
    make_job(other_team, cluster, name="theirs")
    names = {j.name for j in web(operator).get("/jobs/").context["jobs"]}
    assert names == {"ours", "theirs"}


def test_the_list_filters_by_phase_team_and_cluster(web, operator, team, other_team, cluster):
    running = make_job(team, cluster, name="running-one")
    run(running, list(cluster.nodes.all()[:2]))
    make_job(team, cluster, name="waiting-one")
    make_job(other_team, cluster, name="other-team")
    client = web(operator)
    assert [j.name for j in client.get("/jobs/?phase=running").context["jobs"]] == ["running-one"]
    by_team = {j.name for j in client.get("/jobs/?team=vision").context["jobs"]}
    assert by_team == {"running-one", "waiting-one"}
    assert list(client.get("/jobs/?cluster=nowhere").context["jobs"]) == []


def test_a_pending_job_shows_its_reason(web, owner, team, cluster):
    job = make_job(team, cluster, name="big")
    reason = "needs 16 GPUs on cluster cpu-a; team quota has 4 free; position 2 in queue"
    TrainingJob.objects.filter(pk=job.pk).update(pending_reason=reason)
    assert reason in web(owner).get("/jobs/").content.decode()
    assert reason in web(owner).get(f"/jobs/{job.pk}/").content.decode()


def test_the_list_updates_live_with_the_same_filters(web, owner, team, cluster):
    job = make_job(team, cluster, name="queued-soon")
    client = web(owner)
    rows = client.get("/jobs/live/?phase=queued").json()["fragments"]["job-rows"]
    assert "queued-soon" not in rows
    job.transition(Phase.QUEUED, reason="Queued")
    rows = client.get("/jobs/live/?phase=queued").json()["fragments"]["job-rows"]
    assert "queued-soon" in rows and "phase-queued" in rows


def test_an_outsider_gets_404_for_another_team_s_job(web, outsider, team, cluster):
    job = make_job(team, cluster)
    client = web(outsider)
    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/"):
        assert client.get(url).status_code == 404
    for action in ("cancel", "checkpoint", "restart"):
        assert client.post(f"/jobs/{job.pk}/{action}/").status_code == 404
    job.refresh_from_db()
    assert job.cancel_requested_at is None and job.phase == Phase.PENDING
    assert not JobEvent.objects.filter(job=job).exists()


def test_the_job_page_shows_attempts_checkpoints_interval_and_preflight(
        web, teammate, team, cluster):
    job = rich_job(team, cluster)
    TrainingJob.objects.filter(pk=job.pk).update(
        checkpoint_policy="auto", checkpoint_interval_steps=137,
        checkpoint_interval_inputs={"checkpoint_cost_s": 1.8, "mtbf_s": 5220.0},
    )
    resp = web(teammate).get(f"/jobs/{job.pk}/")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert "137 steps" in html
    assert "checkpoint_cost_s=1.8" in html and "mtbf_s=5220" in html
    assert 'id="preflight-bw">1.73 GB/s' in html
    assert [a.number for a in resp.context["attempts"]] == [2, 1]  # newest first
    assert "node lost: XID 79" in html
    assert [c.step for c in resp.context["checkpoints"]] == [200, 150, 100, 50]
    assert "NodeFailed" in html and "&quot;xid&quot;: 79" in html
    assert 'data-category="productive"' in html
    assert resp.context["can_act"] is True


def test_the_live_endpoint_sends_downsampled_series_and_restart_marks(
        web, owner, team, cluster):
    job = rich_job(team, cluster, points=2000)
    data = web(owner).get(f"/jobs/{job.pk}/live/").json()
    charts = data["charts"]
    loss = charts["loss"]
    # Steps 1..1019 from attempt 1 and 1000..1499 from attempt 2; replayed
    # steps count once.
    assert loss["total"] == 1499
    assert len(loss["x"]) == 600 and loss["x"][0] == 1 and loss["x"][-1] == 1499
    assert charts["restarts"] == [{"step": 1000, "attempts": [2], "label": "attempt 2"}]
    assert {c["step"] for c in charts["checkpoints"]} == set(range(50, 1001, 50))
    assert charts["throughput"]["name"] == "tokens_per_s"
    assert charts["val_loss"]["total"] == 20
    assert data["phase"] == "running" and data["terminal"] is False
    assert set(data["fragments"]) == {"job-status", "job-actions", "job-attempts",
                                      "job-checkpoints", "job-events", "job-goodput",
                                      "job-profiles"}
    assert [g["category"] for g in data["goodput"]] == [
        "productive", "rollback", "restart", "checkpoint"]


def test_a_finished_job_s_page_can_skip_the_charts(web, owner, team, cluster):
    job = make_job(team, cluster)
    job.request_cancel("user:olivia")
    data = web(owner).get(f"/jobs/{job.pk}/live/?charts=0").json()
    assert data["terminal"] is True and "charts" not in data


def test_cancel_asks_for_a_cancel_and_records_who(web, teammate, team, cluster):
    job = make_job(team, cluster)
    job.transition(Phase.QUEUED, reason="Queued")
    resp = web(teammate).post(f"/jobs/{job.pk}/cancel/")
    assert resp.status_code == 302
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED and job.cancel_requested_at is not None
    kinds = list(job.events.values_list("kind", "actor"))
    assert ("CancelRequested", "user:tom") in kinds and ("Cancelled", "user:tom") in kinds


def test_a_repeated_cancel_writes_nothing_more(web, owner, team, cluster):
    job = make_job(team, cluster)
    client = web(owner)
    client.post(f"/jobs/{job.pk}/cancel/")
    count = job.events.count()
    resp = client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert job.events.count() == count
    assert "already being cancelled" in resp.content.decode()


def test_a_post_without_the_csrf_token_is_refused(owner, team, cluster):
    job = make_job(team, cluster)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.cancel_requested_at is None


def test_checkpoint_now_sends_a_request_to_the_running_attempt(web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    web(owner).post(f"/jobs/{job.pk}/checkpoint/")
    attempt.refresh_from_db()
    assert attempt.checkpoint_request_id
    event = job.events.get(kind="CheckpointRequested")
    assert event.actor == "user:olivia"
    assert event.evidence == {"request_id": attempt.checkpoint_request_id}


def test_checkpoint_now_without_a_running_attempt_says_so(web, owner, team, cluster):
    job = make_job(team, cluster)
    resp = web(owner).post(f"/jobs/{job.pk}/checkpoint/", follow=True)
    assert "no running attempt" in resp.content.decode()
    assert not job.events.exists()


def test_restart_from_a_checkpoint_records_the_request(web, operator, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    generation = job.generation
    web(operator).post(f"/jobs/{job.pk}/restart/", {"from_step": "100"})
    job.refresh_from_db()
    assert job.restart_from_step == 100 and job.generation == generation + 1
    event = job.events.get(kind="RestartRequested")
    assert event.actor == "user:opal" and event.evidence == {"from_step": 100}


def test_restart_from_a_step_without_a_checkpoint_is_refused(web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100, state="corrupt")
    events = job.events.count()
    for bad, said in (("100", "no committed or verified checkpoint at step 100"),
                      ("7", "no committed or verified checkpoint at step 7"),
                      ("abc", "from_step"), ("", "from_step")):
        resp = web(owner).post(f"/jobs/{job.pk}/restart/", {"from_step": bad}, follow=True)
        assert said in resp.content.decode()
    job.refresh_from_db()
    assert job.restart_from_step is None and job.events.count() == events


def test_the_preflight_bandwidth_of_a_local_gang_is_its_slowest_node(web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    attempt.preflight = {"ok": True, "allreduce": {
        "cpu-a-0": {"node": "cpu-a-0", "busbw_gbps": 2.5, "algbw_gbps": 2.5},
        "cpu-a-1": {"node": "cpu-a-1", "busbw_gbps": 0.75, "algbw_gbps": 0.75}}}
    attempt.save(update_fields=["preflight"])
    html = web(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="preflight-bw">0.75 GB/s' in html


def test_the_job_s_goodput_counts_queueing_as_a_wait_not_as_gpu_hours(
        web, owner, team, cluster):
    job = rich_job(team, cluster)
    goodput(job, None, GoodputEntry.Category.QUEUED, 2.0, "q1")
    client = web(owner)
    ctx = client.get(f"/jobs/{job.pk}/").context["goodput"]
    assert round(ctx["held"], 3) == 1.67 and round(ctx["lost"], 3) == 0.17
    html = client.get(f"/jobs/{job.pk}/live/").json()["fragments"]["job-goodput"]
    assert "Queueing" in html and "(no GPUs held)" in html
    assert "1.670</strong> GPU-h held" in html
    chart = client.get(f"/jobs/{job.pk}/live/").json()["goodput"]
    assert [g["category"] for g in chart] == ["productive", "rollback", "restart", "checkpoint"]
    assert round(sum(g["share"] for g in chart), 6) == 1.0


def test_an_empty_list_says_how_to_submit_and_a_filtered_one_says_nothing_matches(
        web, owner, team):
    client = web(owner)
    assert "regatta submit job.yaml" in client.get("/jobs/").content.decode()
    filtered = client.get("/jobs/?phase=running").content.decode()
    assert "No jobs match these filters." in filtered and "regatta submit" not in filtered


def test_a_missing_page_is_a_console_page_that_names_what_was_asked(web, outsider, team,
                                                                    cluster):
    job = make_job(team, cluster)
    resp = web(outsider).get(f"/jobs/{job.pk}/")
    html = resp.content.decode()
    assert resp.status_code == 404
    assert f"<code>/jobs/{job.pk}/</code>" in html and 'class="topbar"' in html
    assert job.name not in html


def test_a_relaunch_that_skipped_its_preflight_shows_the_newest_check_that_ran(
        web, owner, team, cluster):
    job = make_job(team, cluster)
    run(job, list(cluster.nodes.all()[:2]))  # attempt 1 measured 1.73 GB/s
    JobAttempt.objects.create(job=job, number=2, state="running", preflight={
        "ok": True, "skipped": True, "passed_s_ago": {"cpu-a-0": 12.0, "cpu-a-1": 40.0}})
    html = web(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="preflight-bw">1.73 GB/s' in html and "attempt 1" in html


def test_the_last_error_is_shown_only_while_it_applies(web, owner, team, cluster):
    job = make_job(team, cluster, name="flaky")
    run(job, list(cluster.nodes.all()[:2]))
    error = "hardware: node cpu-a-1 lost (xid 79)"
    # Red while it failed the job or the job restarts from it; muted while
    # the next attempt is being launched; gone once the job runs again or ends
    # otherwise (the timeline keeps it).
    for phase, shown in (("restarting", "bad"), ("failed", "bad"), ("starting", "muted"),
                         ("running", None), ("succeeded", None), ("cancelled", None)):
        TrainingJob.objects.filter(pk=job.pk).update(phase=phase, last_error=error)
        page = web(owner).get(f"/jobs/{job.pk}/").content.decode()
        if shown is None:
            assert 'id="last-error"' not in page, phase
            assert error not in page.split("<h2>Timeline")[0], phase
            continue
        banner = page.split('id="last-error"', 1)[0].rsplit("<p", 1)[1] + page.split(
            'id="last-error"', 1)[1].split("</p>", 1)[0]
        assert error in banner
        assert shown in banner, (phase, banner)
        assert ("Last error" in banner) is (shown == "bad")


def test_the_throughput_line_breaks_where_an_attempt_resumed(web, owner, team, cluster):
    job = rich_job(team, cluster, points=400)  # attempt 2 resumed from step 200
    throughput = web(owner).get(f"/jobs/{job.pk}/live/").json()["charts"]["throughput"]
    gap = throughput["x"].index(200.5)
    assert throughput["y"][gap] is None
    assert throughput["x"][gap - 1] <= 200 < 201 <= throughput["x"][gap + 1]
    assert throughput["y"].count(None) == 1


def test_the_attempts_table_shows_where_each_gang_landed(web, teammate, team, cluster):
    job = rich_job(team, cluster)
    first, second = job.attempts.get(number=1), job.attempts.get(number=2)
    JobAttempt.objects.filter(pk=first.pk).update(placement={
        "label": "topology.kubernetes.io/zone", "values": 2,
        "nodes_per_value": {"rack-a": 1, "rack-b": 1}})
    JobAttempt.objects.filter(pk=second.pk).update(placement={
        "label": "topology.kubernetes.io/zone", "values": 1, "nodes_per_value": {"rack-a": 2}})

    html = web(teammate).get(f"/jobs/{job.pk}/").content.decode()

    assert "<th>Placement</th>" in html
    assert ">packed</span>" in html and ">spread over 2</span>" in html
    assert "rack-a ×1, rack-b ×1" in html


def test_evidence_on_the_timeline_leaves_out_what_has_no_value(web, owner, team, cluster):
    job = make_job(team, cluster)
    job.record("Launched", "attempt 1 on cpu-a-0", evidence={
        "resume_step": None, "nodes": ["cpu-a-0", None], "step": 0})
    html = web(owner).get(f"/jobs/{job.pk}/").content.decode()
    evidence = html.split("<summary>evidence</summary><pre>", 1)[1].split("</pre>", 1)[0]
    assert "null" not in evidence and "NaN" not in evidence and "resume_step" not in evidence
    assert "(none)" in evidence and "&quot;step&quot;: 0" in evidence
