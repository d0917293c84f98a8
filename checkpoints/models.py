from django.db import models, transaction
from django.utils import timezone

from controlplane.lib.errors import IllegalTransition


class Checkpoint(models.Model):
    class State(models.TextChoices):
        WRITING = "writing"
        COMMITTED = "committed"  # the trainer wrote the manifest and marker
        VERIFIED = "verified"  # the control plane re-read it and the checksums match
        CORRUPT = "corrupt"
        # On the branch a person's restart from an earlier step left: never
        # resumed from nor offered, pruned like a corrupt one.
        ABANDONED = "abandoned"
        DELETED = "deleted"

    LOADABLE = (State.COMMITTED, State.VERIFIED)

    STATE_FIELD, STATE_KIND = "state", "checkpoint"
    # Which states each transition may start from. A row starts `committed`
    # (the worker API, or found in storage) or `abandoned` (an old gang's
    # report past a restart point); nothing moves a row to `writing`.
    TRANSITIONS = {
        State.WRITING: frozenset(),
        # From any state: a later attempt replayed the step after a rollback
        # and wrote it anew (jobs/worker_api/reports.record_checkpoint); the
        # row describes the new files, to be verified again.
        State.COMMITTED: frozenset(State),
        # Verification re-reads loadable rows only; a verified one is read
        # again before a later resume.
        State.VERIFIED: frozenset(LOADABLE),
        State.CORRUPT: frozenset(LOADABLE),
        # A person's restart left the branch (jobs/checkpointing.abandon_branch).
        State.ABANDONED: frozenset(State) - {State.ABANDONED, State.DELETED},
        # Retention, once the files are gone (checkpoints/storage.apply_retention).
        State.DELETED: frozenset(State) - {State.DELETED},
    }

    job = models.ForeignKey(
        "jobs.TrainingJob", on_delete=models.CASCADE, related_name="checkpoints"
    )
    attempt = models.ForeignKey(
        "jobs.JobAttempt", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="checkpoints",
    )
    step = models.PositiveIntegerField()
    uri = models.CharField(max_length=1000)
    bytes = models.BigIntegerField(default=0)
    manifest_sha256 = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.COMMITTED)
    state_reason = models.CharField(max_length=300, blank=True)
    save_seconds = models.FloatField(default=0.0)
    blocking_seconds = models.FloatField(default=0.0)
    emergency = models.BooleanField(default=False)
    request_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="uniq_checkpoint_step_per_job")
        ]

    def __str__(self):
        return f"{self.job_id}@{self.step}"

    # A job's or a node's move (controlplane/lib/transitions.change_state)
    # raises when the row is no longer in a state it may leave. A
    # checkpoint's movers read a row and act on it late (verification reads
    # every file first) and may lose it meanwhile to another mover (a
    # restart abandons it, retention deletes it): that is no error, the move
    # is just no longer theirs. So the UPDATE is conditional on the states
    # the table allows, what moved is returned, and only a move the table
    # forbids from the state the caller decided on raises.

    def transition(self, target, *, reason: str, **fields) -> bool:
        """Move to `target`, writing `reason` and `fields` with it; returns
        whether this call moved the row (False: another mover moved it first
        out of the states `target` may be reached from). Raises
        IllegalTransition if the table does not allow `target` from the state
        this object holds. After it, the object holds the row as it is: what
        this call wrote, or the winning mover's state."""
        allowed = self.TRANSITIONS[target]
        if self.state not in allowed:
            raise IllegalTransition(self.STATE_KIND, self.pk, self.state, target)
        changed = Checkpoint.objects.filter(pk=self.pk, state__in=allowed).update(
            state=target, state_reason=reason[:300], **fields)
        if not changed:
            self.refresh_from_db()
            return False
        self._written(target, reason, fields)
        return True

    @classmethod
    def transition_many(cls, rows, target, *, reason: str, **fields) -> list["Checkpoint"]:
        """Move the checkpoints of the queryset `rows` that are in a state
        `target` may be reached from; the others are left as they are.
        Returns the moved ones, as they are after the move. Raises
        IllegalTransition for a target nothing moves to."""
        allowed = cls.TRANSITIONS[target]
        if not allowed:
            raise IllegalTransition(cls.STATE_KIND, "rows", "any state", target)
        with transaction.atomic():
            # Locked (of the checkpoint rows only: `rows` may join the
            # attempt's nullable side), so what is read is what moves: a
            # racing mover waits and then finds them moved. In pk order, so
            # two movers never lock each other's rows crosswise.
            moving = list(rows.filter(state__in=allowed).select_for_update(of=("self",))
                          .order_by("pk"))
            cls.objects.filter(pk__in=[c.pk for c in moving], state__in=allowed).update(
                state=target, state_reason=reason[:300], **fields)
        for checkpoint in moving:
            checkpoint._written(target, reason, fields)
        return moving

    def _written(self, target, reason: str, fields: dict) -> None:
        # What the UPDATE wrote, without reading the row back.
        self.state, self.state_reason = target, reason[:300]
        for name, value in fields.items():
            setattr(self, name, value)


class ModelArtifact(models.Model):
    """The exported final model: consolidated weights and config in the registry."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="artifacts")
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts"
    )
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    uri = models.CharField(max_length=1000)
    bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    # torch (a consolidated model.pt), dcp (a DCP checkpoint kept whole) or
    # files (whatever the job's program saved); checkpoints/export.py.
    format = models.CharField(max_length=32, default="torch")
    config = models.JSONField(default=dict, blank=True)
    # Every file of the artifact: {path: {"sha256", "bytes"}}, as downloads list them.
    files = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="uniq_artifact_version")
        ]
