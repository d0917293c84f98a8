import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_application = get_wsgi_application()

# Imported once Django is set up: it reaches the models.
from controlplane.lib import receiver  # noqa: E402
from jobs.worker_api.views.fast import WorkerFastPath  # noqa: E402

# The ranks' metric batches and heartbeats are answered ahead of the request
# stack when well formed; everything else is Django's (jobs/worker_api/views/fast.py).
application = WorkerFastPath(django_application)


def serve():
    """The web server's entry point (`granian --factory controlplane.wsgi:serve`,
    once in each worker process): the application, with this process marking
    that it listens for heartbeats, since the hang detector counts the ranks'
    silence only while some web process does (controlplane/lib/receiver.py).
    Importing `application` alone (tests, tools) starts nothing."""
    receiver.start_marking()
    return application
