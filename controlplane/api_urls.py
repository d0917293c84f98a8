from django.urls import include, path

urlpatterns = [
    path("", include("accounts.urls")),
    path("", include("clusters.urls")),
    path("", include("jobs.urls")),
    path("", include("notifications.urls")),
]
