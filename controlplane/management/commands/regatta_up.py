"""Run the whole control plane in the foreground: the embedded broker (when
REDIS_URL is unset), web, Celery worker and beat. Ctrl-C stops them all."""

import argparse
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from clusters.models import Cluster
from clusters.providers import get_provider
from controlplane.embedded import start_redis
from controlplane.env import parse_host_port
from jobs.models import JobAttempt


class Command(BaseCommand):
    help = "Start web, worker and beat (and the embedded redis-server) until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.REGATTA_BIND, type=_host_port,
                            help="host:port to serve the web on (default: REGATTA_BIND)")
        parser.add_argument("--web-workers", type=int, default=2)

    def handle(self, *args, bind, web_workers, **options):
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False
        # The children read the bind too: unless REGATTA_PUBLIC_URL says
        # otherwise, the worker hands ranks this address to report to.
        self.env = {**os.environ, "REGATTA_BIND": bind}
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            if settings.EMBEDDED_REDIS:
                redis_proc = start_redis(settings.EMBEDDED_REDIS_SOCKET)
                if redis_proc is not None:
                    self.procs.append(("redis", redis_proc))
            host, _, port = bind.rpartition(":")
            self._spawn("web", [
                sys.executable, "-m", "granian", "--interface", "wsgi", "--no-ws",
                "--host", host.strip("[]"), "--port", port, "--workers", str(web_workers),
                "--blocking-threads", "4", "--respawn-failed-workers", "--access-log",
                "--log-level", "warning", "--workers-kill-timeout", "5",
                "--factory", "controlplane.wsgi:serve",
            ])
            self._spawn("worker", [
                sys.executable, "-m", "celery", "-A", "controlplane", "worker",
                "--loglevel", "INFO", "--concurrency", "2", "--without-gossip",
                "--without-mingle", "-n", "worker@%h",
            ])
            self._spawn("beat", [
                sys.executable, "-m", "celery", "-A", "controlplane", "beat",
                "--loglevel", "INFO", "-s", settings.CELERY_BEAT_SCHEDULE_FILENAME,
            ])
            self.stdout.write(self.style.SUCCESS(
                f"Regatta is up: open http://{bind}/ (admin: http://{bind}/admin/, "
                f"API docs: http://{bind}/api/docs/). Ctrl-C stops everything."
            ))
            while not self.stopping:
                for name, proc in self.procs:
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping")
                        self.stopping = True
                        break
                time.sleep(0.5)
        finally:
            self._shutdown()

    def _on_signal(self, signum, frame):
        self.stopping = True

    def _spawn(self, name, argv):
        # Each child leads its own process group, so stopping it takes its
        # children (granian's and celery's workers) along.
        proc = subprocess.Popen(argv, start_new_session=True, env=self.env)
        self.procs.append((name, proc))

    def _shutdown(self):
        self.stdout.write("stopping training ranks, web, worker, beat …")
        stop_local_training()
        for _, proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        for _, proc in self.procs:
            _signal_group(proc, signal.SIGKILL)  # stragglers of a group leader gone first
        self.stdout.write("stopped.")


def _host_port(value: str) -> str:
    try:
        return parse_host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--bind {exc}") from None


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_local_training(grace_s: float = 20.0) -> None:
    """Stop the ranks that the local provider started: they are detached so
    they outlive a worker restart, which means Ctrl-C must stop them itself.
    SIGTERM gives each an emergency checkpoint; the next start resumes."""
    running = JobAttempt.objects.exclude(state__in=JobAttempt.ENDED).filter(
        job__cluster__provider="local"
    ).select_related("job__cluster")
    for attempt in running:
        if attempt.provider_ref:
            attempt.note_stop_by_control_plane()
            get_provider(attempt.job.cluster).stop(attempt.provider_ref, grace_s=grace_s)
    # Their warm standbys (clusters/providers/local/standby.py) are detached too.
    for cluster in Cluster.objects.filter(provider="local"):
        get_provider(cluster).stop_standbys()
