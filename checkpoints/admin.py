from django.contrib import admin

from .models import Checkpoint, ModelArtifact


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("job", "step", "state", "bytes", "save_seconds", "blocking_seconds",
                    "emergency", "created_at")
    list_filter = ("state", "emergency")
    search_fields = ("job__name", "uri")
    readonly_fields = [f.name for f in Checkpoint._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(ModelArtifact)
class ModelArtifactAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "job", "bytes", "format", "created_at")
    search_fields = ("name",)
    readonly_fields = [f.name for f in ModelArtifact._meta.fields]
