from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts.throttles import throttle_login

from .monitoring import metrics_view

urlpatterns = [
    # Before admin.site.urls, which would otherwise answer this path.
    path("admin/login/", throttle_login(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("controlplane.api_urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("frontend.urls")),
]

handler404 = "controlplane.lib.http.page_not_found"
handler500 = "controlplane.lib.http.server_error"
