from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.db.models import F, IntegerField, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from controlplane.lib.errors import IllegalTransition
from jobs.admission import request_admission

from . import services
from .models import JobAttempt, JobEvent, Quota, Team, TrainingJob


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "display_name", "member_count")
    search_fields = ("name", "display_name")
    filter_horizontal = ("members",)
    inlines = [QuotaInline]

    @admin.display(description="members")
    def member_count(self, obj):
        return obj.members.count()


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ("team", "cluster", "gpus_in_use", "gpus", "max_running_jobs",
                    "priority_weight", "can_borrow")
    list_filter = ("cluster", "can_borrow")
    list_editable = ("gpus", "max_running_jobs", "priority_weight", "can_borrow")

    def get_queryset(self, request):
        # One query for the whole list: GPUs held by the team's active jobs.
        held = (
            TrainingJob.objects.filter(
                team=OuterRef("team"), cluster=OuterRef("cluster"),
                phase__in=TrainingJob.HOLDS_GPUS,
            )
            .values("team")
            .annotate(total=Sum(F("num_nodes") * F("gpus_per_node")))
            .values("total")
        )
        return super().get_queryset(request).select_related("team", "cluster").annotate(
            _gpus_in_use=Coalesce(Subquery(held, output_field=IntegerField()), 0)
        )

    @admin.display(description="GPUs in use / limit", ordering="_gpus_in_use")
    def gpus_in_use(self, obj):
        return f"{obj._gpus_in_use} / {obj.gpus}"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # A bigger quota may let queued jobs in now, not at the next sweep.
        request_admission(obj.cluster_id)


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    fields = ("created_at", "kind", "from_phase", "to_phase", "actor", "message", "evidence")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    fields = ("number", "state", "started_at", "ended_at", "exit_code", "failure_class",
              "resume_step")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    """Jobs are read here, and cancelled. Submitting and changing a spec go
    through the API and CLI, which validate it, write the Submitted event and
    set storage_uri; and a save from here would write back the whole row,
    status included, over what the reconciler wrote since the page loaded."""

    list_display = ("id", "name", "team", "cluster", "phase", "num_nodes", "gpus_per_node",
                    "current_step", "pending_reason", "created_at")
    list_filter = ("phase", "kind", "cluster", "team", "strategy")
    search_fields = ("name",)
    inlines = [JobAttemptInline, JobEventInline]
    actions = ["cancel"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        # Deleting the row would orphan the job's running ranks and its
        # checkpoints; a job is cancelled and the reconciler stops it.
        return False

    def has_cancel_permission(self, request):
        # Cancelling is what the model's change permission stands for here.
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return request.user.has_perm(f"{opts.app_label}.{codename}")

    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel(self, request, queryset):
        asked = 0
        for job in queryset:
            try:
                if services.cancel(job, request.user):
                    asked += 1
            except IllegalTransition as exc:
                self.message_user(request, str(exc), messages.WARNING)
        self.message_user(request, f"Cancel asked for {asked} job(s).")
