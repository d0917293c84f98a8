"""Metric names and rollups, kept on ingest (jobs/metrics/ingest.py, jobs/metrics/rollups.py),
built here for the points already stored: one INSERT ... SELECT per level,
in SQL, so a table of ten million points is rolled up without passing
through Python."""

import django.db.models.deletion
from django.db import migrations, models

from jobs.metrics import rollups


def backfill(apps, schema_editor):
    rollups.rebuild_names(using=schema_editor.connection)
    rollups.rebuild(using=schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0006_list_page_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='metricpoint',
            name='attempt',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_points', to='jobs.jobattempt'),
        ),
        migrations.AlterField(
            model_name='metricpoint',
            name='job',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_points', to='jobs.trainingjob'),
        ),
        migrations.CreateModel(
            name='MetricName',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_names', to='jobs.trainingjob')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('job', 'name'), name='uniq_metric_name')],
            },
        ),
        migrations.CreateModel(
            name='MetricRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64)),
                ('rank0', models.BooleanField()),
                ('level', models.PositiveIntegerField()),
                ('bucket', models.PositiveIntegerField()),
                ('s0', models.PositiveIntegerField()),
                ('s1', models.PositiveIntegerField()),
                ('vmin', models.FloatField()),
                ('vmax', models.FloatField()),
                ('vsum', models.FloatField()),
                ('n', models.PositiveIntegerField()),
                ('vlast', models.FloatField()),
                ('attempt', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_rollups', to='jobs.jobattempt')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('attempt', 'name', 'rank0', 'level', 'bucket'), name='uniq_metric_rollup')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
