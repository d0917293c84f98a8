"""Indexes for the API's list pages (newest first, by cursor) under each
filter the list offers, and a job's timeline page: issue 17. The unfiltered
jobs list needs none: the created_at index gives its order."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0005_profiles"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="trainingjob",
            index=models.Index(fields=["team", "created_at", "id"], name="job_team_page_idx"),
        ),
        migrations.AddIndex(
            model_name="trainingjob",
            index=models.Index(fields=["cluster", "created_at", "id"],
                               name="job_cluster_page_idx"),
        ),
        migrations.AddIndex(
            model_name="trainingjob",
            index=models.Index(fields=["phase", "created_at", "id"], name="job_phase_page_idx"),
        ),
        migrations.AddIndex(
            model_name="jobevent",
            index=models.Index(fields=["job", "created_at", "id"], name="event_job_page_idx"),
        ),
    ]
