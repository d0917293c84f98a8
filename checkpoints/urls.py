from django.urls import path

from . import views

app_name = "checkpoints"

urlpatterns = [
    path("jobs/<int:pk>/checkpoints/", views.JobCheckpointListView.as_view(),
         name="job-checkpoints"),
    path("checkpoints/<int:pk>/", views.CheckpointDetailView.as_view(), name="checkpoint-detail"),
    path("artifacts/", views.ArtifactListView.as_view(), name="artifact-list"),
    path("artifacts/<int:pk>/", views.ArtifactDetailView.as_view(), name="artifact-detail"),
]
