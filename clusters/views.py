"""The fleet API: readable by every person; node actions for operators."""

import django_filters
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsOperator, IsPerson
from controlplane.lib.api import Conflict
from controlplane.lib.errors import PermanentError

from . import services
from .models import Cluster, Node, NodeHealthEvent, NodePool
from .serializers import (
    ClusterSerializer,
    HealthEventSerializer,
    NodeDetailSerializer,
    NodePoolSerializer,
    NodeSerializer,
    node_counts_by_cluster,
)
from .validators import FaultValidator, ReasonValidator


class ClusterListView(generics.ListAPIView):
    permission_classes = [IsPerson]
    serializer_class = ClusterSerializer
    queryset = Cluster.objects.prefetch_related("pools__cluster").order_by("name")

    def get_serializer(self, *args, **kwargs):
        if kwargs.get("many"):  # a page of clusters: their node counts in one query
            kwargs["context"] = {**self.get_serializer_context(),
                                 "node_counts": node_counts_by_cluster(c.pk for c in args[0])}
        return super().get_serializer(*args, **kwargs)


class ClusterDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = ClusterSerializer
    queryset = ClusterListView.queryset


class PoolFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = NodePool
        fields = ["cluster"]


class PoolListView(generics.ListAPIView):
    permission_classes = [IsPerson]
    serializer_class = NodePoolSerializer
    filterset_class = PoolFilter
    queryset = NodePool.objects.select_related("cluster").order_by("cluster__name", "name")


class PoolDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = NodePoolSerializer
    queryset = PoolListView.queryset


class NodeFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name")
    pool = django_filters.CharFilter(field_name="pool__name")
    state = django_filters.ChoiceFilter(choices=Node.State.choices)

    class Meta:
        model = Node
        fields = ["cluster", "pool", "state"]


class NodeListView(generics.ListAPIView):
    permission_classes = [IsPerson]
    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    queryset = Node.objects.select_related("cluster", "pool", "replaces").order_by(
        "cluster__name", "name"
    )


class NodeDetailView(generics.RetrieveAPIView):
    """A node with its recent state changes and health events."""

    permission_classes = [IsPerson]
    serializer_class = NodeDetailSerializer
    queryset = NodeListView.queryset


class HealthEventFilter(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name")
    cluster = django_filters.CharFilter(field_name="node__cluster__name")
    severity = django_filters.ChoiceFilter(choices=NodeHealthEvent.Severity.choices)

    class Meta:
        model = NodeHealthEvent
        fields = ["node", "cluster", "severity"]


class HealthEventListView(generics.ListAPIView):
    permission_classes = [IsPerson]
    serializer_class = HealthEventSerializer
    filterset_class = HealthEventFilter
    queryset = NodeHealthEvent.objects.select_related("node__cluster").order_by(
        "-created_at", "-id"
    )


class NodeActionView(APIView):
    """POST {"reason"}: 200 with the node; 409 when its state forbids it."""

    permission_classes = [IsPerson, IsOperator]
    operation = None  # a function of clusters.services

    @extend_schema(request=ReasonValidator,
                   responses={200: NodeDetailSerializer, 409: OpenApiResponse()})
    def post(self, request, pk):
        node = get_object_or_404(Node.objects.select_related("cluster", "pool"), pk=pk)
        body = ReasonValidator(data=request.data)
        body.is_valid(raise_exception=True)
        self.operation(node, request.user, body.validated_data.get("reason", ""))
        node.refresh_from_db()
        return Response(NodeDetailSerializer(node).data)


class CordonView(NodeActionView):
    operation = staticmethod(services.cordon)


class UncordonView(NodeActionView):
    operation = staticmethod(services.uncordon)


class DrainView(NodeActionView):
    operation = staticmethod(services.drain)


class ReplaceView(NodeActionView):
    operation = staticmethod(services.request_replacement)


class ReturnView(NodeActionView):
    """Return a cordoned, failed or replaced node to service once it passes
    a health check (409 for a node in any other state, or held by the
    scheduler's admin)."""

    operation = staticmethod(services.return_to_service)


class FaultView(APIView):
    """Inject a fault into a node of a local cluster (demos and tests)."""

    permission_classes = [IsPerson, IsOperator]

    @extend_schema(request=FaultValidator, responses={
        202: OpenApiResponse(),
        409: OpenApiResponse(description="The node cannot take this fault now: its cluster is "
                                         "not a local one, or it runs no ranks to kill.")})
    def post(self, request, pk):
        node = get_object_or_404(Node.objects.select_related("cluster", "pool__cluster"), pk=pk)
        body = FaultValidator(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            result = services.inject_fault(node, body.validated_data["kind"])
        except PermanentError as exc:  # the node's state, not the request's
            raise Conflict(str(exc)) from exc
        return Response({"node": node.name, "kind": body.validated_data["kind"],
                         "result": result}, status=status.HTTP_202_ACCEPTED)
