from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Clusters ask what runs on a node through this port, never by
        # importing jobs (clusters/workload.py).
        from clusters import workload

        from . import (
            receivers,  # noqa: F401  (connects the receivers)
            tasks,  # noqa: F401  (registers the tasks other apps send by name)
        )
        from .scheduling import jobs_on_nodes

        workload.register(jobs_on_nodes)
