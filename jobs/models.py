"""Teams, quotas, training jobs and everything that happens to them.

A job's spec is written by people (through the API or admin); its status is
written only by the reconciler, through the transition methods below.
"""

import hashlib
import secrets

from django.conf import settings
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.lib.errors import IllegalTransition
from controlplane.lib.transitions import change_state, change_states, event_time


class Team(models.Model):
    name = models.SlugField(max_length=63, unique=True)
    display_name = models.CharField(max_length=150, blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="teams", blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.display_name or self.name


class Quota(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="quotas")
    gpus = models.PositiveIntegerField(help_text="GPUs the team may hold at once on this cluster")
    max_running_jobs = models.PositiveIntegerField(default=10)
    priority_weight = models.PositiveIntegerField(default=1)
    can_borrow = models.BooleanField(
        default=False, help_text="May use idle capacity beyond the quota when nobody else waits"
    )

    class Meta:
        ordering = ["team__name", "cluster__name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "cluster"], name="uniq_quota_team_cluster")
        ]

    def __str__(self):
        return f"{self.team} on {self.cluster}: {self.gpus} GPUs"


class Phase(models.TextChoices):
    PENDING = "pending"
    QUEUED = "queued"
    ADMITTED = "admitted"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class FailureClass(models.TextChoices):
    CODE = "code", "Code error (fail fast)"
    TRANSIENT = "transient", "Transient (retry with backoff)"
    HARDWARE = "hardware", "Hardware (replace node, resume)"
    PREEMPTED = "preempted", "Preempted (spot notice or drain)"
    HANG = "hang", "Hang (missed heartbeats)"
    PROCESS = "process", "Process died (relaunch in place)"


DEFAULT_RESTART_BUDGETS = {"code": 0, "transient": 3, "hardware": 5, "preempted": 10, "hang": 3,
                           "process": 3}


def default_restart_budgets():
    return dict(DEFAULT_RESTART_BUDGETS)


# The condition a job running a program that sends no heartbeats carries.
NO_HEARTBEATS = "NoHeartbeats"

# An eval run's priority: below any a training job may be given (the spec's
# priority is -1000..1000, jobs/validators.py), so within its team every
# training job goes first and may preempt it (jobs/evals/).
EVAL_PRIORITY = -1001


class TrainingJob(models.Model):
    STATE_FIELD, STATE_KIND = "phase", "job"
    P = Phase
    TERMINAL = (P.SUCCEEDED, P.FAILED, P.CANCELLED)
    HOLDS_GPUS = (P.ADMITTED, P.STARTING, P.RUNNING, P.RESTARTING)
    # Allowed source phases for each target phase.
    TRANSITIONS = {
        # From an end: a person's rerun of the job from a checkpoint;
        # starting/running → queued: preempted (jobs/reconcile/preemption.py).
        P.QUEUED: {P.PENDING, P.RESTARTING, P.ADMITTED, P.STARTING, P.RUNNING, P.SUCCEEDED,
                   P.FAILED, P.CANCELLED},
        P.ADMITTED: {P.QUEUED},
        P.STARTING: {P.ADMITTED, P.RESTARTING},
        P.RUNNING: {P.STARTING, P.RESTARTING},
        P.RESTARTING: {P.STARTING, P.RUNNING},
        P.SUCCEEDED: {P.STARTING, P.RUNNING, P.RESTARTING},
        P.FAILED: {P.PENDING, P.QUEUED, P.ADMITTED, P.STARTING, P.RUNNING, P.RESTARTING},
        P.CANCELLED: {P.PENDING, P.QUEUED, P.ADMITTED, P.STARTING, P.RUNNING, P.RESTARTING},
    }

    class Strategy(models.TextChoices):
        DDP = "ddp"
        FSDP = "fsdp"

    class CheckpointPolicy(models.TextChoices):
        STEPS = "steps", "Every N steps"
        AUTO = "auto", "Auto (Young/Daly)"

    class Kind(models.TextChoices):
        TRAIN = "train", "Training"
        # A short run that evaluates one of its parent's checkpoints on spare
        # capacity (jobs/evals/); it never writes checkpoints of its own.
        EVAL = "eval", "Evaluation"

    class Completion(models.TextChoices):
        # What "done" means. A program of the job's own promises nothing but
        # its exit codes unless it says so; the built-in trainer promises
        # its final step's checkpoint.
        EXIT = "exit", "All ranks exit 0"
        CHECKPOINT = "checkpoint", "A verified checkpoint of the final step"

    # --- spec: the job itself ------------------------------------------------
    name = models.CharField(max_length=100)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="jobs")
    pool = models.ForeignKey(
        "clusters.NodePool", on_delete=models.PROTECT, related_name="jobs", null=True, blank=True
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="submitted_jobs",
    )
    image = models.CharField(max_length=300, default="regatta/trainer:latest")
    entrypoint = models.JSONField(default=list, blank=True, help_text="argv; empty: the trainer")
    # A program of the job's own: its arguments after the entrypoint, and
    # environment variables of its own (never the launch contract's names).
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    completion = models.CharField(max_length=12, choices=Completion.choices,
                                  default=Completion.CHECKPOINT)
    num_nodes = models.PositiveIntegerField()
    gpus_per_node = models.PositiveIntegerField()
    strategy = models.CharField(max_length=8, choices=Strategy.choices, default=Strategy.DDP)
    hyperparameters = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    spot_allowed = models.BooleanField(default=False)
    storage_uri = models.CharField(max_length=1000, blank=True)
    generation = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    # --- desired state people ask for beside the spec -------------------------
    # A cancel is asked for here and finished by the reconciler, which stops
    # the ranks.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # A person may ask to restart from a chosen checkpoint step.
    restart_from_step = models.PositiveIntegerField(null=True, blank=True)

    # --- status (the reconciler's) --------------------------------------------
    phase = models.CharField(max_length=12, choices=Phase.choices, default=Phase.PENDING)
    observed_generation = models.PositiveIntegerField(default=0)
    conditions = models.JSONField(default=list, blank=True)
    pending_reason = models.CharField(max_length=500, blank=True)
    last_error = models.TextField(blank=True)
    current_step = models.PositiveIntegerField(default=0)
    progress = models.JSONField(default=dict, blank=True)
    phase_changed_at = models.DateTimeField(default=timezone.now)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    next_reconcile_at = models.DateTimeField(null=True, blank=True, db_index=True)

    # --- a feature's spec and status, on the job's row ------------------------
    # Each group below is owned by the package it names. They stay on this
    # row, not in tables of their own, because the passes write them in the
    # same conditional UPDATE as the phase (admission sets the borrowed GPUs
    # with ADMITTED, preemption `preempted_at` with QUEUED, a rerun clears
    # the restart books with QUEUED) under the one row lock every pass
    # takes, and the admission pass reads them for hundreds of queued jobs
    # at once (docs/design.md, "TrainingJob's columns").
    #
    # Checkpointing (jobs/checkpointing/): the policy, and the interval `auto` chose.
    checkpoint_policy = models.CharField(
        max_length=8, choices=CheckpointPolicy.choices, default=CheckpointPolicy.STEPS
    )
    checkpoint_every_steps = models.PositiveIntegerField(default=100)
    keep_last = models.PositiveIntegerField(default=3)
    checkpoint_interval_steps = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_interval_inputs = models.JSONField(default=dict, blank=True)

    # Restart budgets (jobs/recovery/budgets.py).
    restart_budgets = models.JSONField(default=default_restart_budgets)
    # The window of progress after which a class's spent restarts are
    # forgiven (jobs/recovery/budgets.py); 0 turns that half of the window off.
    budget_reset_steps = models.PositiveIntegerField(default=1000)
    budget_reset_minutes = models.PositiveIntegerField(default=60)
    # Restarts per class in this run, forgiven or not ("N in all").
    restart_counts = models.JSONField(default=dict, blank=True)
    # Restarts per class charged to the job within the window: what the
    # budget is held against (jobs/recovery/budgets.py).
    budget_spent = models.JSONField(default=dict, blank=True)
    # Per class, the step and time of its last failure; and the streak of
    # unconfirmed failures on fresh nodes.
    restart_marks = models.JSONField(default=dict, blank=True)

    # Admission (jobs/admission/). Sharing (sharing.py), written by the
    # admission pass with ADMITTED: GPUs this gang holds beyond its team's
    # quota, and whose idle quota they are ({team id: GPUs}); a lender that
    # needs them back reclaims the gang.
    borrowed_gpus = models.PositiveIntegerField(default=0)
    borrowed_from = models.JSONField(default=dict, blank=True)
    # Set when a preemption sends the job back to the queue: it goes first
    # among its team's jobs of its priority; cleared at its next admission.
    preempted_at = models.DateTimeField(null=True, blank=True)

    # Evaluation (jobs/evals/). On a training job, `eval_policy` is the
    # spec's `eval` block (empty: none). An eval run is a job of its own,
    # made by its parent's reconcile: `parent` and the checkpoint step it
    # evaluates are its spec; `eval_result` is what it reported.
    kind = models.CharField(max_length=5, choices=Kind.choices, default=Kind.TRAIN)
    eval_policy = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey("self", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="evals")
    eval_step = models.PositiveIntegerField(null=True, blank=True)
    eval_result = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # A checkpoint is evaluated by one run: a reconcile that runs
            # twice, or on two workers, makes it once.
            models.UniqueConstraint(fields=["parent", "eval_step"], name="uniq_eval_per_step",
                                    condition=models.Q(parent__isnull=False)),
        ]
        indexes = [
            models.Index(fields=["cluster", "phase"]),
            models.Index(fields=["team", "phase"]),
            # The list's pages (newest first, by cursor) under each of its
            # filters, for a team, cluster or phase with few jobs among many
            # (unfiltered, the created_at index serves); `bench/api_scale.py
            # --explain` shows the plans.
            models.Index(fields=["team", "created_at", "id"], name="job_team_page_idx"),
            models.Index(fields=["cluster", "created_at", "id"], name="job_cluster_page_idx"),
            models.Index(fields=["phase", "created_at", "id"], name="job_phase_page_idx"),
        ]

    def __str__(self):
        return f"{self.name} (#{self.pk})"

    @property
    def world_size(self) -> int:
        """Ranks in the gang, one per GPU: the GPUs it holds."""
        return self.num_nodes * self.gpus_per_node

    @property
    def is_eval(self) -> bool:
        return self.kind == self.Kind.EVAL

    @property
    def is_terminal(self) -> bool:
        return self.phase in self.TERMINAL

    @property
    def heartbeats_missing(self) -> bool:
        """Running a program that sends no heartbeats (jobs/reconcile sets
        the NoHeartbeats condition): it is watched by its processes alone."""
        return self.phase == Phase.RUNNING and any(
            c.get("type") == NO_HEARTBEATS for c in self.conditions or [])

    @property
    def effective_checkpoint_every(self) -> int:
        return self.checkpoint_interval_steps or self.checkpoint_every_steps

    @classmethod
    def transition_many(cls, moves: list[tuple["TrainingJob", str, dict]], target, *,
                        source, reason: str, fields=(), actor: str = "reconciler") -> None:
        """`transition` for many jobs the caller's transaction holds locked
        in `source`: (job, message, evidence) each, its `phase_changed_at`
        and the columns in `fields` set on the job by the caller. One
        conditional UPDATE per batch and one INSERT of the events (the
        admission pass admits hundreds of jobs at once)."""
        jobs = [job for job, _, _ in moves]
        change_states(jobs, target, source=source, fields=("phase_changed_at", *fields))
        JobEvent.objects.bulk_create([
            JobEvent(job=job, kind=reason, message=message, actor=actor, evidence=evidence,
                     from_phase=source, to_phase=target,
                     created_at=event_time(job.phase_changed_at))
            for job, message, evidence in moves
        ], batch_size=500)

    def transition(self, target, *, reason: str, message: str = "", actor: str = "reconciler",
                   evidence=None, attempt=None, now=None, **fields) -> "JobEvent":
        """Move to `target` only from an allowed phase, with a conditional
        update, and write the JobEvent. Raises IllegalTransition otherwise.

        Only reconcile code and the few model methods below call this.
        """
        now = now or timezone.now()
        with transaction.atomic():
            source = change_state(self, target, changed_at_field="phase_changed_at", now=now,
                                  **fields)
            return JobEvent.objects.create(
                job=self, attempt=attempt, kind=reason, message=message, actor=actor,
                evidence=evidence or {}, from_phase=source, to_phase=target,
                created_at=event_time(now),
            )

    def record(self, kind: str, message: str = "", *, actor: str = "reconciler",
               evidence=None, attempt=None, now=None, key: str | None = None) -> "JobEvent":
        """Write a timeline event that does not change the phase. A `key`
        already stored for this job raises IntegrityError."""
        return JobEvent.objects.create(
            job=self, attempt=attempt, kind=kind, message=message, actor=actor,
            evidence=evidence or {}, from_phase=self.phase, to_phase=self.phase,
            created_at=event_time(now), key=key or None,
        )

    def request_cancel(self, actor: str, now=None) -> bool:
        """Ask for the job to stop. Idempotent: returns False (and writes
        nothing) if a cancel was already asked for or the job already ended
        cancelled; raises IllegalTransition if it ended otherwise."""
        now = now or timezone.now()
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(pk=self.pk)
            if job.phase == Phase.CANCELLED or job.cancel_requested_at is not None:
                self.refresh_from_db()
                return False
            if job.is_terminal:
                raise IllegalTransition("job", job.pk, job.phase, Phase.CANCELLED)
            TrainingJob.objects.filter(pk=job.pk).update(
                cancel_requested_at=now, generation=F("generation") + 1
            )
            job.refresh_from_db()
            job.record("CancelRequested", f"cancel asked by {actor}", actor=actor, now=now)
            if job.phase in (Phase.PENDING, Phase.QUEUED):
                # Nothing runs yet: nothing for the reconciler to stop.
                job.transition(Phase.CANCELLED, reason="Cancelled", actor=actor,
                               message="cancelled before it started", now=now,
                               finished_at=now, pending_reason="")
        self.refresh_from_db()
        return True

    def request_restart(self, from_step: int, actor: str, now=None) -> "JobEvent":
        """Ask the reconciler to restart the gang from checkpoint `from_step`
        (a spec change: the generation rises). Raises IllegalTransition for
        a job that has ended."""
        now = now or timezone.now()
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(pk=self.pk)
            if job.is_terminal or job.cancel_requested_at is not None:
                raise IllegalTransition("job", job.pk, job.phase, Phase.RESTARTING)
            TrainingJob.objects.filter(pk=job.pk).update(
                restart_from_step=from_step, generation=F("generation") + 1
            )
            job.refresh_from_db()
            event = job.record(
                "RestartRequested", f"restart from step {from_step} asked by {actor}",
                actor=actor, evidence={"from_step": from_step}, now=now,
            )
        self.refresh_from_db()
        return event

    def rerun(self, from_step: int, actor: str, now=None) -> "JobEvent":
        """Start an ended job (succeeded, failed, cancelled) again as a new run
        from checkpoint `from_step`: back to the queue with a new generation,
        this run's restart books empty, the old run's conditions and error
        gone. Raises IllegalTransition unless the job has ended (a live job
        restarts through request_restart)."""
        now = now or timezone.now()
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(pk=self.pk)
            if not job.is_terminal:
                raise IllegalTransition("job", job.pk, job.phase, "rerun")
            previous = job.phase
            event = job.transition(
                Phase.QUEUED, reason="Rerun", actor=actor, now=now,
                message=f"rerun from step {from_step} asked by {actor} (was {previous})",
                evidence={"from_step": from_step, "was": previous,
                          "generation": job.generation + 1,
                          "restart_counts": job.restart_counts},
                restart_from_step=from_step, generation=F("generation") + 1,
                restart_counts={}, budget_spent={}, restart_marks={}, conditions=[],
                cancel_requested_at=None, finished_at=None, last_error="",
                pending_reason=f"rerun from step {from_step}: waiting for {job.world_size} GPUs",
            )
        self.refresh_from_db()
        return event

    def running_attempt(self) -> "JobAttempt | None":
        return self.attempts.filter(state=JobAttempt.State.RUNNING).order_by("-number").first()


class JobAttempt(models.Model):
    """One launch of the gang on a set of nodes."""

    class State(models.TextChoices):
        PREFLIGHT = "preflight"
        STARTING = "starting"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        STOPPED = "stopped"

    ENDED = (State.SUCCEEDED, State.FAILED, State.STOPPED)
    STATE_FIELD, STATE_KIND = "state", "attempt"
    # Allowed source states for each target state.
    TRANSITIONS = {
        State.STARTING: {State.PREFLIGHT},
        State.RUNNING: {State.STARTING},
        State.SUCCEEDED: {State.STARTING, State.RUNNING},
        State.FAILED: {State.PREFLIGHT, State.STARTING, State.RUNNING},
        State.STOPPED: {State.PREFLIGHT, State.STARTING, State.RUNNING},
    }

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PREFLIGHT)
    nodes = models.ManyToManyField("clusters.Node", through="AttemptNode", related_name="attempts")
    token_hash = models.CharField(max_length=64, blank=True)
    resumed_from = models.ForeignKey(
        "checkpoints.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="resumed_attempts",
    )
    resume_step = models.PositiveIntegerField(null=True, blank=True)
    # The preflight check's result: all-reduce bandwidth, DCGM, failed nodes.
    preflight = models.JSONField(default=dict, blank=True)
    # Where the gang landed: the pool's topology label and the nodes per
    # value of it (jobs/admission/placement.py).
    placement = models.JSONField(default=dict, blank=True)
    # What the provider needs to find this attempt again after a worker restart.
    provider_ref = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    first_step_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_class = models.CharField(max_length=10, choices=FailureClass.choices, blank=True)
    failure_reason = models.TextField(blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_step = models.PositiveIntegerField(default=0)
    # Directives to the trainer, carried on heartbeat replies.
    checkpoint_request_id = models.CharField(max_length=64, blank=True)
    checkpoint_requested_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # "Profile the next N steps": the request stays up like the checkpoint
    # request; the trainer remembers the ids it served.
    profile_request_id = models.CharField(max_length=64, blank=True)
    profile_steps = models.PositiveSmallIntegerField(default=0)
    profile_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="uniq_attempt_number_per_job")
        ]

    def __str__(self):
        return f"{self.job_id}#{self.number}"

    def launched(self, now, **fields) -> None:
        """preflight → starting: the provider started the ranks. Conditional
        on the row, not on what this object read: a pass that adopts ranks
        a dead pass launched finds the row still in preflight."""
        change_state(self, self.State.STARTING, expected=None, started_at=now, **fields)

    def first_step_seen(self, now) -> None:
        """starting → running, once; a later pass finds it running already."""
        change_state(self, self.State.RUNNING, expected=None,
                     noop_from=(self.State.RUNNING, *self.ENDED),
                     first_step_at=self.first_step_at or now)

    def end(self, state, now, **fields) -> bool:
        """End the attempt (succeeded, failed, stopped); False, and nothing
        written, if it has ended already (another pass got there first)."""
        source = change_state(self, state, expected=None, noop_from=self.ENDED, ended_at=now,
                              **fields)
        return source is not None

    def request_checkpoint(self, actor: str, now=None) -> str:
        """Ask the running trainer for a checkpoint now: a fresh request id
        goes out on the next heartbeat reply. Raises IllegalTransition unless
        the attempt runs."""
        now = now or timezone.now()
        request_id = secrets.token_hex(8)
        with transaction.atomic():
            changed = JobAttempt.objects.filter(pk=self.pk, state=self.State.RUNNING).update(
                checkpoint_request_id=request_id, checkpoint_requested_at=now
            )
            if not changed:
                current = JobAttempt.objects.filter(pk=self.pk).values_list("state", flat=True)
                raise IllegalTransition("attempt", self.pk, current.first() or self.state,
                                        "checkpoint")
            self.refresh_from_db()
            self.job.record("CheckpointRequested", f"checkpoint asked by {actor}", actor=actor,
                            attempt=self, evidence={"request_id": request_id}, now=now)
        return request_id

    def note_stop_by_control_plane(self, now=None) -> None:
        """The control plane itself is stopping this attempt (Ctrl-C of
        `make run`): its ranks' exit 83 is then a stop from outside the job,
        never charged to its budget (jobs/recovery/budgets.py). Also carried to the
        trainer as the `stop` directive."""
        JobAttempt.objects.filter(pk=self.pk, stop_requested_at__isnull=True).update(
            stop_requested_at=now or timezone.now())

    def directives(self) -> dict:
        job = self.job
        return directives(self.checkpoint_request_id, self.stop_requested_at,
                          job.checkpoint_policy, job.checkpoint_interval_steps,
                          self.profile_request_id, self.profile_steps)


def directives(checkpoint_request_id: str, stop_requested_at, checkpoint_policy: str,
               checkpoint_interval_steps, profile_request_id: str = "",
               profile_steps=None) -> dict:
    """What a heartbeat reply tells the trainer (docs/trainer-protocol.md),
    from the columns it depends on: the heartbeat reads them in its own
    write instead of loading the rows (jobs/worker_api/heartbeats.py)."""
    return {
        "checkpoint_request": checkpoint_request_id or None,
        "stop": stop_requested_at is not None,
        "checkpoint_interval_steps": (checkpoint_interval_steps
                                      if checkpoint_policy == "auto" else None),
        "profile": ({"request_id": profile_request_id, "steps": profile_steps}
                    if profile_request_id else None),
    }


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class AttemptNode(models.Model):
    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="placements")
    node = models.ForeignKey("clusters.Node", on_delete=models.PROTECT, related_name="placements")
    node_rank = models.PositiveIntegerField()

    class Meta:
        ordering = ["attempt", "node_rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "node_rank"], name="uniq_node_rank"),
            models.UniqueConstraint(fields=["attempt", "node"], name="uniq_node_per_attempt"),
        ]


class RankStatus(models.Model):
    """The latest heartbeat of each rank of an attempt."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="ranks")
    rank = models.PositiveIntegerField()
    node_name = models.CharField(max_length=253, blank=True)
    step = models.PositiveIntegerField(default=0)
    samples_per_s = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    step_time_s = models.FloatField(null=True, blank=True)
    gpu = models.JSONField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField()

    class Meta:
        ordering = ["attempt", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank"], name="uniq_rank_status")
        ]


class JobEvent(models.Model):
    """The job's timeline and audit log: who or what did it, why, the evidence."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(
        JobAttempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    kind = models.CharField(max_length=64)
    message = models.TextField(blank=True)
    actor = models.CharField(max_length=150, default="reconciler")
    evidence = models.JSONField(default=dict, blank=True)
    from_phase = models.CharField(max_length=12, blank=True)
    to_phase = models.CharField(max_length=12, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # A worker's own name for the event (docs/trainer-protocol.md): a rank
    # resends an event whose reply it never got, and the collection of
    # undelivered reports may bring one the web already stored; each is
    # stored once per key.
    key = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        # A job's timeline page by cursor.
        indexes = [models.Index(fields=["job", "created_at", "id"], name="event_job_page_idx")]
        constraints = [models.UniqueConstraint(
            fields=["job", "key"], condition=models.Q(key__isnull=False),
            name="event_job_key_uniq")]

    def __str__(self):
        return f"{self.job_id} {self.kind}"
