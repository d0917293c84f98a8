from django.urls import path

from . import views

app_name = "clusters"

urlpatterns = [
    path("clusters/", views.ClusterListView.as_view(), name="cluster-list"),
    path("clusters/<int:pk>/", views.ClusterDetailView.as_view(), name="cluster-detail"),
    path("pools/", views.PoolListView.as_view(), name="pool-list"),
    path("pools/<int:pk>/", views.PoolDetailView.as_view(), name="pool-detail"),
    path("nodes/", views.NodeListView.as_view(), name="node-list"),
    path("nodes/<int:pk>/", views.NodeDetailView.as_view(), name="node-detail"),
    path("nodes/<int:pk>/cordon/", views.CordonView.as_view(), name="node-cordon"),
    path("nodes/<int:pk>/uncordon/", views.UncordonView.as_view(), name="node-uncordon"),
    path("nodes/<int:pk>/drain/", views.DrainView.as_view(), name="node-drain"),
    path("nodes/<int:pk>/replace/", views.ReplaceView.as_view(), name="node-replace"),
    path("nodes/<int:pk>/return/", views.ReturnView.as_view(), name="node-return"),
    path("nodes/<int:pk>/faults/", views.FaultView.as_view(), name="node-faults"),
    path("health-events/", views.HealthEventListView.as_view(), name="health-event-list"),
]
