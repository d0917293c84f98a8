"""Issue a person's first API token from the shell (later ones come from
POST /api/v1/tokens/). The raw token is printed once and never stored."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.models import ApiToken


class Command(BaseCommand):
    help = "Issue an API token for a user and print it once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label to tell tokens apart")

    def handle(self, username, name, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        _, raw = ApiToken.issue(user, name[:100])
        self.stdout.write(raw)
