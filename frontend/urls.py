from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from accounts.throttles import throttle_login

from . import views

app_name = "frontend"

urlpatterns = [
    path("login/", throttle_login(views.LoginView.as_view()), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
    # Asked for by browsers on every page that names no icon (the admin, the
    # API docs, a JSON response).
    path("favicon.ico", RedirectView.as_view(url=static("frontend/favicon.ico")),
         name="favicon"),
    path("fleet/", views.fleet, name="fleet"),
    path("fleet/live/", views.fleet_live, name="fleet-live"),
    path("nodes/<int:pk>/", views.node_detail, name="node"),
    path("nodes/<int:pk>/live/", views.node_live, name="node-live"),
    path("nodes/<int:pk>/fault/", views.node_fault, name="node-fault"),
    path("nodes/<int:pk>/<slug:action>/", views.node_action, name="node-action"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/live/", views.job_list_live, name="jobs-live"),
    path("compare/", views.compare_jobs, name="compare"),
    path("jobs/<int:pk>/", views.job_detail, name="job"),
    path("jobs/<int:pk>/live/", views.job_live, name="job-live"),
    path("jobs/<int:pk>/checkpoints/", views.job_checkpoints, name="job-checkpoints"),
    path("jobs/<int:pk>/attempts/", views.job_attempts, name="job-attempts"),
    path("jobs/<int:pk>/cancel/", views.cancel, name="job-cancel"),
    path("jobs/<int:pk>/checkpoint/", views.checkpoint, name="job-checkpoint"),
    path("jobs/<int:pk>/restart/", views.restart, name="job-restart"),
    path("jobs/<int:pk>/profile/", views.profile, name="job-profile"),
    path("teams/", views.team_list, name="teams"),
    path("teams/<slug:name>/", views.team_detail, name="team"),
    path("teams/<slug:name>/live/", views.team_live, name="team-live"),
]
