from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from controlplane.lib import tasks as ports

        from . import tasks

        # Services, reconcilers and other apps send it through the port.
        ports.RECONCILE_CLUSTER.provide(tasks.reconcile_cluster)
