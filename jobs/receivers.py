"""What the jobs app does when its rows change, connected in JobsConfig.ready."""

from django.db.models.signals import pre_delete
from django.dispatch import receiver

from .metrics.models import MetricPoint
from .models import JobAttempt


@receiver(pre_delete, sender=JobAttempt, dispatch_uid="jobs.delete_attempt_points")
def delete_attempt_points(sender, instance, using, **kwargs):
    """Delete an attempt's metric points, once no batch can add to them.

    Metric points carry no foreign key (jobs.metrics.models.MetricPoint): a batch's
    statement locks its attempts FOR KEY SHARE and writes only where the row
    is there (jobs/metrics/ingest.py). Locking the attempt FOR UPDATE first waits
    for a batch in flight to commit, and then its points are deleted with
    the rest (each statement of the deleting transaction sees what committed
    before it); a later batch waits for the deletion and finds the attempt
    gone. Deleted here, by the key's job prefix, rather than by Django's
    cascade, which would look them up by attempt, for which there is no
    index. (SQLite runs one writer at a time and ignores the lock.)
    """
    JobAttempt.objects.using(using).select_for_update().filter(pk=instance.pk).exists()
    MetricPoint.objects.using(using).filter(job_id=instance.job_id,
                                            attempt_id=instance.pk).delete()
