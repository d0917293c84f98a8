from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Jobs never import notifications: the timeline's events reach the
        # webhooks through a post_save receiver connected here.
        from . import delivery, receivers, tasks  # noqa: F401  (receivers: connects them)

        delivery.DELIVER.provide(tasks.deliver_webhook)
