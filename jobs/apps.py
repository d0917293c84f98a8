from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Clusters ask what runs on a node through this port, never by
        # importing jobs (clusters/workload.py).
        from clusters import workload
        from controlplane.lib import tasks as ports
        from jobs.admission import jobs_on_nodes

        from . import receivers, tasks  # noqa: F401  (receivers: connects them)

        workload.register(jobs_on_nodes)
        # Code of other apps, and this app's own lower layers, send these
        # tasks through the kernel's ports, never by importing jobs.tasks.
        ports.RECONCILE_JOB.provide(tasks.reconcile_job)
        ports.RECONCILE_JOBS.provide(tasks.reconcile_jobs)
        ports.ADMIT_CLUSTER.provide(tasks.admit_cluster)
