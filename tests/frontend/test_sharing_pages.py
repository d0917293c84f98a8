"""The pages show sharing: a team's borrowed and lent GPUs, a borrowed gang
on the fleet, and a job's preemptions with the checkpoint each saved."""

from clusters.models import Node
from jobs.models import Phase, TrainingJob

from .factories import make_job, run


def borrowing_gang(team, lender, cluster):
    """A 2-node gang of `team` holding 2 GPUs of `lender`'s quota."""
    job = make_job(team, cluster, name="borrower")
    run(job, [Node.objects.get(name="cpu-a-0"), Node.objects.get(name="cpu-a-1")])
    TrainingJob.objects.filter(pk=job.pk).update(borrowed_gpus=2,
                                                 borrowed_from={str(lender.id): 2})
    return job


def test_the_team_page_shows_gpus_borrowed_and_lent(web, owner, team, other_team, cluster):
    borrowing_gang(other_team, team, cluster)
    resp = web(owner).get("/teams/vision/")
    (quota,) = resp.context["quotas"]
    assert (quota["gpus_lent"], quota["gpus_borrowed"], quota["gpus_free"]) == (2, 0, 2)
    html = resp.content.decode()
    assert "<th class=\"nowrap\" title=\"GPUs of this quota that other teams' gangs hold\">Lent" \
        in html
    assert "<td class=\"nowrap\" data-lent>2</td>" in html


def test_the_fleet_page_marks_a_borrowed_gang(web, operator, team, other_team, cluster):
    borrowing_gang(team, other_team, cluster)
    resp = web(operator).get("/fleet/")
    tiles = {t.node.name: t.borrowed for t in resp.context["clusters"][0].tiles}
    assert tiles["cpu-a-0"] and tiles["cpu-a-1"] and not tiles["cpu-a-2"]
    assert "borrower · borrowed" in resp.content.decode()


def test_the_job_page_shows_its_preemptions_with_the_checkpoint_saved(web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, [Node.objects.get(name="cpu-a-0"), Node.objects.get(name="cpu-a-1")])
    high = make_job(team, cluster, name="urgent", priority=5)
    job.transition(Phase.QUEUED, reason="Preempted", attempt=attempt,
                   message=f"preempted by job #{high.id}: checkpoint at step 120, 0 steps lost",
                   evidence={"by": high.id, "why": "priority", "checkpoint_step": 120,
                             "steps_lost": 0, "waited_s": 3.2, "resume_step": 120})
    resp = web(owner).get(f"/jobs/{job.id}/")
    (row,) = resp.context["preemptions"]
    assert (row["by"], row["checkpoint_step"], row["steps_lost"]) == (high.id, 120, 0)
    html = resp.content.decode()
    assert "<h2>Preemptions</h2>" in html and "step 120" in html and "3.2 s" in html
