# Profiling on demand: the request on the attempt, one trace row per rank.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0004_sharing'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobattempt',
            name='profile_request_id',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='jobattempt',
            name='profile_requested_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='jobattempt',
            name='profile_steps',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.CreateModel(
            name='ProfileTrace',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('request_id', models.CharField(max_length=64)),
                ('start_step', models.PositiveIntegerField()),
                ('steps', models.PositiveSmallIntegerField()),
                ('rank', models.PositiveIntegerField()),
                ('path', models.CharField(max_length=300)),
                ('bytes', models.BigIntegerField(default=0)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('attempt', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='profile_traces', to='jobs.jobattempt')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='profile_traces', to='jobs.trainingjob')),
            ],
            options={
                'ordering': ['-created_at', 'request_id', 'rank'],
                'constraints': [models.UniqueConstraint(fields=('attempt', 'request_id', 'rank'), name='uniq_profile_trace')],
            },
        ),
    ]
