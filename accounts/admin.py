from django.contrib import admin

from .models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "prefix")
    # The hash is useless to a person and the raw token is never stored.
    exclude = ("token_hash",)
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request):
        return False
