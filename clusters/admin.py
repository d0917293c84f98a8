from django.contrib import admin, messages

from controlplane.lib.errors import IllegalTransition, PermanentError

from . import services
from .models import Cluster, Node, NodeEvent, NodeHealthEvent, NodePool
from .providers import FaultKind

# Written by the cluster reconciler only (clusters/reconcile/scaling.py).
POOL_STATUS = ("scaling_watch_since", "scaling_failures", "scaling_failed_at", "scaling_error",
               "scaling_permanent", "scaling_seen")


class NodePoolInline(admin.TabularInline):
    model = NodePool
    extra = 0
    readonly_fields = POOL_STATUS


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "provider", "description", "last_reconciled_at")
    search_fields = ("name",)
    inlines = [NodePoolInline]
    readonly_fields = ("last_reconciled_at", "next_reconcile_at")


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ("__str__", "instance_type", "gpus_per_node", "capacity_type", "size",
                    "spare_count", "scaling_failures", "scaling_error")
    list_filter = ("cluster", "capacity_type")
    readonly_fields = POOL_STATUS


class NodeEventInline(admin.TabularInline):
    model = NodeEvent
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "from_state", "to_state", "reason", "actor", "evidence")

    def has_add_permission(self, request, obj=None):
        return False


def _node_action(modeladmin, request, queryset, verb, action):
    done = skipped = 0
    for node in queryset:
        try:
            event = action(node, request.user, "in the admin")
        except IllegalTransition as exc:
            modeladmin.message_user(request, str(exc), messages.WARNING)
            continue
        if event is None:
            skipped += 1
        else:
            done += 1
    modeladmin.message_user(request, f"{verb}: {done} node(s); {skipped} already so.")


def _fault_action(kind):
    def action(modeladmin, request, queryset):
        for node in queryset:
            try:
                services.inject_fault(node, kind)
            except PermanentError as exc:
                modeladmin.message_user(request, str(exc), messages.ERROR)
                continue
            NodeEvent.objects.create(
                node=node, from_state=node.state, to_state=node.state,
                actor=f"user:{request.user.username}",
                reason=f"fault injected in the admin: {kind}", evidence={"fault": kind},
            )
            modeladmin.message_user(request, f"{kind} injected into {node.name}")

    action.__name__ = f"inject_{kind}"
    return admin.action(description=f"Inject fault (local only): {kind.replace('_', ' ')}")(
        action
    )


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "pool", "state", "is_spare", "gpus", "state_reason",
                    "last_heartbeat_at", "failure_count")
    list_filter = ("cluster", "state", "is_spare")
    search_fields = ("name", "provider_id")
    readonly_fields = ("state", "state_reason", "state_changed_at", "last_heartbeat_at",
                       "failure_count", "ready_seconds", "replaces", "replace_requested_at",
                       "preflight_passed_at", "released_at")
    inlines = [NodeEventInline]
    actions = ["cordon", "uncordon", "replace"] + [
        _fault_action(kind) for kind in (FaultKind.KILL, FaultKind.KILL_RANK, FaultKind.HANG,
                                         FaultKind.XID, FaultKind.SPOT_NOTICE)
    ]

    @admin.action(description="Cordon the selected nodes")
    def cordon(self, request, queryset):
        _node_action(self, request, queryset, "cordoned", services.cordon)

    @admin.action(description="Uncordon the selected nodes")
    def uncordon(self, request, queryset):
        _node_action(self, request, queryset, "uncordoned", services.uncordon)

    @admin.action(description="Replace the selected nodes from the spare pool")
    def replace(self, request, queryset):
        _node_action(self, request, queryset, "replacement asked", services.request_replacement)


@admin.register(NodeHealthEvent)
class NodeHealthEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "node", "kind", "severity", "message", "handled_at")
    list_filter = ("kind", "severity")
    readonly_fields = [f.name for f in NodeHealthEvent._meta.fields]

    def has_add_permission(self, request):
        return False
