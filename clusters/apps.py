from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import tasks  # noqa: F401  (registers the tasks other apps send by name)
