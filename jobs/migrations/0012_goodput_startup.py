from django.db import migrations, models


def startup_lines(apps, schema_editor):
    """A first attempt's start-up was booked as restart latency (key
    `startup-<attempt>`); it is a category of its own now."""
    GoodputEntry = apps.get_model("jobs", "GoodputEntry")
    GoodputEntry.objects.filter(category="restart", key__startswith="startup-").update(
        category="startup")


def back_to_restart(apps, schema_editor):
    GoodputEntry = apps.get_model("jobs", "GoodputEntry")
    GoodputEntry.objects.filter(category="startup").update(category="restart")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_event_key"),
    ]

    operations = [
        migrations.AlterField(
            model_name="goodputentry",
            name="category",
            field=models.CharField(choices=[
                ("productive", "Productive training"), ("rollback", "Work lost to rollback"),
                ("restart", "Restart latency"), ("startup", "Start-up"),
                ("checkpoint", "Checkpoint stalls"), ("hang", "Hang before detection"),
                ("queued", "Queueing"), ("preemption", "Work lost to preemption"),
                ("eval", "Evaluation runs")], max_length=12),
        ),
        migrations.RunPython(startup_lines, back_to_restart),
    ]
