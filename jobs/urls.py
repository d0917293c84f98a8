from django.urls import path

from jobs.evals import views as evals
from jobs.goodput import views as goodput
from jobs.metrics.views import compare
from jobs.metrics.views import series as job_metrics
from jobs.profiling import views as profiles
from jobs.views import (
    checkpoints,
    downloads,
    job_actions,
    job_detail,
    job_list,
    job_timeline,
    quotas,
    teams,
)
from jobs.worker_api.views import checkpoints as worker_checkpoints
from jobs.worker_api.views import events as worker_events
from jobs.worker_api.views import heartbeat as worker_heartbeat
from jobs.worker_api.views import metrics as worker_metrics
from jobs.worker_api.views import profiles as worker_profiles

app_name = "jobs"

urlpatterns = [
    path("jobs/", job_list.JobListView.as_view(), name="job-list"),
    path("jobs/compare/", compare.CompareView.as_view(), name="job-compare"),
    path("jobs/<int:pk>/", job_detail.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:pk>/cancel/", job_actions.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:pk>/checkpoint/", job_actions.JobCheckpointView.as_view(),
         name="job-checkpoint"),
    path("jobs/<int:pk>/restart/", job_actions.JobRestartView.as_view(), name="job-restart"),
    path("jobs/<int:pk>/profile/", profiles.JobProfileView.as_view(), name="job-profile"),
    path("jobs/<int:pk>/profiles/", profiles.JobProfileListView.as_view(), name="job-profiles"),
    path("jobs/<int:pk>/profiles/<int:trace_id>/file", profiles.ProfileTraceFileView.as_view(),
         name="job-profile-trace"),
    path("jobs/<int:pk>/events/", job_timeline.JobEventsView.as_view(), name="job-events"),
    path("jobs/<int:pk>/attempts/", job_timeline.JobAttemptsView.as_view(), name="job-attempts"),
    path("jobs/<int:pk>/metrics/", job_metrics.JobMetricsView.as_view(), name="job-metrics"),
    path("jobs/<int:pk>/metrics/names/", job_metrics.JobMetricNamesView.as_view(),
         name="job-metric-names"),
    path("jobs/<int:pk>/metrics/tensorboard/", compare.JobTensorBoardView.as_view(),
         name="job-metrics-tensorboard"),
    path("jobs/<int:pk>/evals/", evals.JobEvalsView.as_view(), name="job-evals"),
    path("jobs/<int:pk>/goodput/", goodput.JobGoodputView.as_view(), name="job-goodput"),
    path("jobs/<int:pk>/checkpoints/", checkpoints.JobCheckpointListView.as_view(),
         name="job-checkpoints"),
    path("checkpoints/<int:pk>/", checkpoints.CheckpointDetailView.as_view(),
         name="checkpoint-detail"),
    path("artifacts/", checkpoints.ArtifactListView.as_view(), name="artifact-list"),
    path("artifacts/<int:pk>/", checkpoints.ArtifactDetailView.as_view(), name="artifact-detail"),
    path("artifacts/<int:pk>/files/", downloads.ArtifactFilesView.as_view(),
         name="artifact-files"),
    path("artifacts/<int:pk>/files/<path:path>", downloads.ArtifactFileView.as_view(),
         name="artifact-file"),
    path("checkpoints/<int:pk>/files/", downloads.CheckpointFilesView.as_view(),
         name="checkpoint-files"),
    path("checkpoints/<int:pk>/files/<path:path>", downloads.CheckpointFileView.as_view(),
         name="checkpoint-file"),
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
    path("worker/attempts/<int:attempt_id>/profiles", worker_profiles.ProfileTraceView.as_view(),
         name="worker-profiles"),
    path("worker/attempts/<int:attempt_id>/events", worker_events.EventView.as_view(),
         name="worker-events"),
]
