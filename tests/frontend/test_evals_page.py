"""The job page's Evaluations section and the job list's eval runs
(jobs/evals/): what the eval runs reported, shown with the parent."""

from jobs.models import Phase, TrainingJob

from .factories import make_job


def eval_of(parent, step, **status):
    return make_job(parent.team, parent.cluster, name=f"{parent.name} eval@{step}",
                    kind=TrainingJob.Kind.EVAL, parent=parent, eval_step=step, num_nodes=1,
                    gpus_per_node=1, priority=-1001, **status)


def test_the_parent_page_lists_its_eval_runs_with_val_loss_perplexity_and_samples(
        web, owner, team, cluster):
    parent = make_job(team, cluster, name="train", eval_policy={
        "every_checkpoint": True, "pool": "default", "nodes": 1, "gpus_per_node": 1})
    eval_of(parent, 50, phase=Phase.SUCCEEDED, eval_result={
        "metrics": {"val_loss": 1.2345, "val_perplexity": 3.4367},
        "samples": [{"prompt": "ROMEO:", "completion": " <But soft>"}], "attempt": 1})
    eval_of(parent, 100, phase=Phase.QUEUED, pending_reason="needs 1 node; 0 free in pool x")
    page = web(owner).get(f"/jobs/{parent.pk}/").content.decode()
    section = page[page.index('id="evaluations"'):]
    assert "every checkpoint on pool default" in section
    assert "1.2345" in section and "3.44" in section
    # Samples are the model's text: escaped, never markup.
    assert "ROMEO:" in section and "&lt;But soft&gt;" in section
    assert "needs 1 node; 0 free in pool x" in section
    live = web(owner).get(f"/jobs/{parent.pk}/live/?charts=0").json()
    assert "job-evals" in live["fragments"]


def test_a_job_without_an_eval_policy_has_no_evaluations_section(web, owner, team, cluster):
    job = make_job(team, cluster, name="plain")
    assert 'id="evaluations"' not in web(owner).get(f"/jobs/{job.pk}/").content.decode()


def test_the_job_list_tags_an_eval_run_with_its_parent(web, owner, team, cluster):
    parent = make_job(team, cluster, name="train")
    run = eval_of(parent, 50)
    page = web(owner).get("/jobs/").content.decode()
    row = page[page.index(f'href="/jobs/{run.pk}/"'):]
    assert f'eval of <a href="/jobs/{parent.pk}/">#{parent.pk}</a>' in row[:600]
    eval_page = web(owner).get(f"/jobs/{run.pk}/").content.decode()
    assert f"step 50 of <a href=\"/jobs/{parent.pk}/\">job #{parent.pk}</a>" in eval_page
