from django.urls import path

from .views import (
    checkpoints,
    goodput,
    job_actions,
    job_detail,
    job_list,
    job_metrics,
    job_timeline,
    quotas,
    teams,
    worker_checkpoints,
    worker_events,
    worker_heartbeat,
    worker_metrics,
)

app_name = "jobs"

urlpatterns = [
    path("jobs/", job_list.JobListView.as_view(), name="job-list"),
    path("jobs/<int:pk>/", job_detail.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:pk>/cancel/", job_actions.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:pk>/checkpoint/", job_actions.JobCheckpointView.as_view(),
         name="job-checkpoint"),
    path("jobs/<int:pk>/restart/", job_actions.JobRestartView.as_view(), name="job-restart"),
    path("jobs/<int:pk>/events/", job_timeline.JobEventsView.as_view(), name="job-events"),
    path("jobs/<int:pk>/attempts/", job_timeline.JobAttemptsView.as_view(), name="job-attempts"),
    path("jobs/<int:pk>/metrics/", job_metrics.JobMetricsView.as_view(), name="job-metrics"),
    path("jobs/<int:pk>/metrics/names/", job_metrics.JobMetricNamesView.as_view(),
         name="job-metric-names"),
    path("jobs/<int:pk>/goodput/", goodput.JobGoodputView.as_view(), name="job-goodput"),
    path("jobs/<int:pk>/checkpoints/", checkpoints.JobCheckpointListView.as_view(),
         name="job-checkpoints"),
    path("checkpoints/<int:pk>/", checkpoints.CheckpointDetailView.as_view(),
         name="checkpoint-detail"),
    path("artifacts/", checkpoints.ArtifactListView.as_view(), name="artifact-list"),
    path("artifacts/<int:pk>/", checkpoints.ArtifactDetailView.as_view(), name="artifact-detail"),
    path("teams/", teams.TeamListView.as_view(), name="team-list"),
    path("teams/<slug:name>/goodput/", goodput.TeamGoodputView.as_view(), name="team-goodput"),
    path("quotas/", quotas.QuotaListView.as_view(), name="quota-list"),
    path("quotas/<int:pk>/", quotas.QuotaDetailView.as_view(), name="quota-detail"),
    # The trainer's endpoints (docs/trainer-protocol.md): no trailing slash.
    path("worker/attempts/<int:attempt_id>/heartbeat", worker_heartbeat.HeartbeatView.as_view(),
         name="worker-heartbeat"),
    path("worker/attempts/<int:attempt_id>/metrics", worker_metrics.MetricsView.as_view(),
         name="worker-metrics"),
    path("worker/attempts/<int:attempt_id>/checkpoints",
         worker_checkpoints.CheckpointCommittedView.as_view(), name="worker-checkpoints"),
    path("worker/attempts/<int:attempt_id>/events", worker_events.EventView.as_view(),
         name="worker-events"),
]
