from django.db.models import Count
from rest_framework import serializers

from .models import Cluster, Node, NodeEvent, NodeHealthEvent, NodePool


class NodePoolSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    cluster_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = NodePool
        fields = ("id", "name", "cluster", "cluster_id", "instance_type", "gpus_per_node",
                  "capacity_type", "size", "spare_count", "efa")
        read_only_fields = fields


def node_counts(nodes) -> dict:
    counts = {state: 0 for state in Node.State.values}
    for row in nodes.values("state").annotate(n=Count("id")):
        counts[row["state"]] = row["n"]
    return counts


def node_counts_by_cluster(cluster_ids) -> dict[int, dict]:
    """{cluster id: node_counts} for many clusters in one grouped query."""
    counts = {pk: {state: 0 for state in Node.State.values} for pk in cluster_ids}
    rows = (Node.objects.filter(cluster_id__in=list(counts)).values("cluster_id", "state")
            .annotate(n=Count("id")).order_by())
    for row in rows:
        counts[row["cluster_id"]][row["state"]] = row["n"]
    return counts


class ClusterSerializer(serializers.ModelSerializer):
    pools = NodePoolSerializer(many=True, read_only=True)
    node_counts = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = ("id", "name", "provider", "description", "pools", "node_counts",
                  "created_at", "last_reconciled_at")
        read_only_fields = fields

    def get_node_counts(self, cluster) -> dict[str, int]:
        # A list hands in every row's counts at once (views.ClusterListView).
        counts = self.context.get("node_counts") or {}
        return counts.get(cluster.pk) or node_counts(cluster.nodes.all())


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True)
    replaces = serializers.CharField(source="replaces.name", read_only=True, allow_null=True,
                                     default=None)

    class Meta:
        model = Node
        fields = ("id", "name", "cluster", "pool", "provider_id", "address", "state",
                  "state_reason", "state_changed_at", "is_spare", "gpus", "labels",
                  "last_heartbeat_at", "failure_count", "ready_seconds", "replace_requested_at",
                  "replaces", "preflight_passed_at", "admin_hold", "not_ready_since",
                  "return_requested_at", "provider_status", "created_at")
        read_only_fields = fields


class NodeEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = NodeEvent
        fields = ("id", "from_state", "to_state", "reason", "actor", "evidence", "created_at")
        read_only_fields = fields


class HealthEventSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    node_id = serializers.IntegerField(read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)

    class Meta:
        model = NodeHealthEvent
        fields = ("id", "node", "node_id", "cluster", "kind", "severity", "message", "evidence",
                  "created_at", "handled_at")
        read_only_fields = fields


class NodeDetailSerializer(NodeSerializer):
    events = serializers.SerializerMethodField()
    health_events = serializers.SerializerMethodField()

    class Meta(NodeSerializer.Meta):
        fields = (*NodeSerializer.Meta.fields, "events", "health_events")
        read_only_fields = fields

    def get_events(self, node) -> NodeEventSerializer(many=True):
        return NodeEventSerializer(node.events.order_by("-created_at", "-id")[:50], many=True).data

    def get_health_events(self, node) -> HealthEventSerializer(many=True):
        recent = node.health_events.select_related("node__cluster").order_by("-created_at", "-id")
        return HealthEventSerializer(recent[:50], many=True).data
