"""Rebuild the metric names table and rollups from the raw points.

The data migration (jobs/migrations/0005) runs the same SQL once; this is
for points written around the ingest path (a restore, a hand-made import)."""

from django.core.management.base import BaseCommand
from django.db import transaction

from jobs.metrics import rollups


class Command(BaseCommand):
    help = "Rebuild metric names and rollups from the stored points."

    def add_arguments(self, parser):
        parser.add_argument("--attempt", type=int, action="append", dest="attempts",
                            help="only this attempt's rollups (repeatable); default all")

    def handle(self, *args, attempts=None, **options):
        with transaction.atomic():
            names = rollups.rebuild_names()
            written = rollups.rebuild(attempts)
        self.stdout.write(f"{names} metric names, {written} rollup rows")
