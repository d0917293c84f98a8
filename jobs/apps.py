from importlib import import_module

from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"
    # Models of this app that live with their feature. Django is shown them
    # here, as it imports the app's models, rather than by jobs/models.py
    # importing them: every feature imports jobs.models, so that would tie
    # the models every feature builds on to every feature.
    FEATURE_MODELS = ("jobs.metrics.models", "jobs.goodput.models", "jobs.profiling.models")

    def import_models(self):
        super().import_models()
        for name in self.FEATURE_MODELS:
            import_module(name)

    def ready(self):
        # Clusters ask what runs on a node through this port, never by
        # importing jobs (clusters/workload.py).
        from clusters import workload
        from clusters.reconcile import late_logs
        from controlplane.lib import tasks as ports
        from jobs import evals
        from jobs.admission import jobs_on_nodes
        from jobs.metrics import laid_in
        from jobs.recovery import late_logs as late_log_records

        from . import receivers, tasks  # noqa: F401  (receivers: connects them)

        workload.register(jobs_on_nodes)
        # An eval run's results are laid into its parent's series.
        laid_in.EVAL_RESULTS.provide(evals.series_points, evals.metric_names)
        # A failed rank's log read later lands on its job's timeline.
        late_logs.register(late_log_records.record)
        # Code of other apps, and this app's own lower layers, send these
        # tasks through the kernel's ports, never by importing jobs.tasks.
        ports.RECONCILE_JOB.provide(tasks.reconcile_job)
        ports.RECONCILE_JOBS.provide(tasks.reconcile_jobs)
        ports.ADMIT_CLUSTER.provide(tasks.admit_cluster)
