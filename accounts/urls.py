from django.urls import path

from . import views

app_name = "accounts"

urlpatterns = [
    path("me/", views.MeView.as_view(), name="me"),
    path("tokens/", views.TokenListView.as_view(), name="token-list"),
    path("tokens/<int:pk>/", views.TokenDetailView.as_view(), name="token-detail"),
]
