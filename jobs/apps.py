from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Clusters ask what runs on a node through this port, never by
        # importing jobs (clusters/workload.py).
        from clusters import workload
        from clusters.reconcile import late_logs
        from controlplane.lib import tasks as ports
        from jobs.admission import jobs_on_nodes
        from jobs.recovery import late_logs as late_log_records

        from . import receivers, tasks  # noqa: F401  (receivers: connects them)

        workload.register(jobs_on_nodes)
        # A failed rank's log read later lands on its job's timeline.
        late_logs.register(late_log_records.record)
        # Code of other apps, and this app's own lower layers, send these
        # tasks through the kernel's ports, never by importing jobs.tasks.
        ports.RECONCILE_JOB.provide(tasks.reconcile_job)
        ports.RECONCILE_JOBS.provide(tasks.reconcile_jobs)
        ports.ADMIT_CLUSTER.provide(tasks.admit_cluster)
