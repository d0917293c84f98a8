from django.urls import path

from . import views

app_name = "notifications"

urlpatterns = [
    path("webhooks/", views.WebhookListView.as_view(), name="webhook-list"),
    path("webhooks/<int:pk>/", views.WebhookDetailView.as_view(), name="webhook-detail"),
    path("webhooks/<int:pk>/deliveries/", views.WebhookDeliveriesView.as_view(),
         name="webhook-deliveries"),
    path("webhooks/<int:pk>/rotate-secret/", views.WebhookRotateSecretView.as_view(),
         name="webhook-rotate-secret"),
    path("webhooks/<int:pk>/ping/", views.WebhookPingView.as_view(), name="webhook-ping"),
    path("deliveries/<int:pk>/retry/", views.DeliveryRetryView.as_view(),
         name="delivery-retry"),
]
