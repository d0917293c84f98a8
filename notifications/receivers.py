"""Timeline events become deliveries (connected in NotificationsConfig.ready).

A post_save receiver rather than a call from the reconcilers: jobs never
import notifications. JobEvent rows written with bulk_create send no signal;
only admission writes them so (Admitted), which nobody is notified of.
"""

from django.db.models.signals import post_save
from django.dispatch import receiver

from jobs.models import JobEvent

from . import delivery


@receiver(post_save, sender=JobEvent, dispatch_uid="notifications.job_event")
def job_event_saved(sender, instance: JobEvent, created: bool, raw: bool = False, **kwargs):
    if created and not raw:  # raw: loaded from a fixture, not something that happened
        delivery.notify(instance)
