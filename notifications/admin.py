"""Webhooks and their delivery log in the admin. The log is read-only: what
was sent stays as it was sent; "retry now" asks for one more try."""

from django.contrib import admin, messages
from django.db import transaction
from django.utils import timezone

from . import delivery
from .models import Delivery, Webhook


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ("id", "team", "url", "format", "active", "events", "created_at")
    list_filter = ("active", "format", "team")
    search_fields = ("url", "description", "team__name")
    readonly_fields = ("secret_hint", "created_by", "created_at")


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "webhook", "event_type", "status", "attempts", "response_code",
                    "next_attempt_at", "created_at", "delivered_at")
    list_filter = ("status", "event_type", "webhook__team")
    search_fields = ("webhook__url", "last_error")
    list_select_related = ("webhook__team",)
    date_hierarchy = "created_at"
    actions = ["retry_now"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.action(description="Retry now (one more try, even if given up on)")
    def retry_now(self, request, queryset):
        now, asked = timezone.now(), 0
        with transaction.atomic():
            for row in queryset:
                asked += delivery.retry_now(row, now)
        skipped = queryset.count() - asked
        self.message_user(request, f"Retrying {asked} delivery(ies); {skipped} delivered "
                          "already.", messages.SUCCESS if asked else messages.WARNING)
