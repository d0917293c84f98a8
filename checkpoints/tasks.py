from celery import shared_task
from django.utils import timezone

from . import retention


@shared_task(acks_late=True, ignore_result=True)
def sweep_retention() -> None:
    retention.sweep(timezone.now())
