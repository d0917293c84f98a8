"""Run the whole control plane in the foreground: the embedded broker (when
REDIS_URL is unset), web, Celery worker and beat. Ctrl-C stops them all.

The console says what a person needs: where the web is, how to sign in,
one line per job state change, and the processes' warnings and errors. All
they print (access log, task log) goes to `<state>/logs/regatta.log`;
`--verbose` prints it here too. With `--install-fleet` (`./run`), the local
fleet's torch installs behind the running web, its progress on the console
and the fleet page (clusters/providers/local/worker_env.py)."""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections
from regatta.node import standby

from clusters.models import Cluster
from clusters.providers import get_provider
from clusters.providers.local import worker_env
from controlplane.embedded import start_redis
from controlplane.env import parse_host_port
from jobs.models import JobAttempt, JobEvent

from .regatta_demo import demo_sign_in

# A line a person should see without --verbose: a level of WARNING and up,
# in Celery's ("[... WARNING/MainProcess]") or the settings' format, or a
# Python traceback (its indented lines and the exception follow it).
ALARM = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|^Traceback \(most recent call last\)")
# A client's 4xx (a mistyped URL, a refused token) is the client's business:
# the access log in the file has it.
CLIENT_ERROR = re.compile(r"\bWARNING django\.request\b")
UP_TIMEOUT_S = 120.0
WARM_EVERY_S = 5.0


class Command(BaseCommand):
    help = "Start web, worker and beat (and the embedded redis-server) until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.REGATTA_BIND, type=_host_port,
                            help="host:port to serve the web on (default: REGATTA_BIND)")
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--verbose", action="store_true",
                            help="print every process's output here (access and task logs "
                                 "included), not only to the log file")
        parser.add_argument("--prepare", action="store_true",
                            help="migrate and create the demo world first, in this process "
                                 "(DEMO_ARGS: regatta_demo's arguments), as ./run does")
        parser.add_argument("--install-fleet", action="store_true",
                            help="install the local fleet's torch behind the running web "
                                 "(`make fleet-env`); jobs wait for it")

    def handle(self, *args, bind, web_workers, verbose=False, install_fleet=False,
               prepare=False, **options):
        if prepare:
            # One Python start instead of three (migrate, the demo, this).
            call_command("migrate", "--noinput", verbosity=0)
            said = io.StringIO()
            call_command("regatta_demo", *shlex.split(os.environ.get("DEMO_ARGS", "")),
                         stdout=said)
            # The sign-in and the token are in the start-up block below.
            for line in said.getvalue().splitlines():
                if line.startswith("demo job"):
                    self.stdout.write(line)
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False
        self.verbose = verbose
        self.bind = bind
        self.say_lock = threading.Lock()
        self.installer: worker_env.Installer | None = None
        logs = Path(settings.STATE_DIR) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / "regatta.log"
        self.log = open(self.log_path, "a", buffering=1, encoding="utf-8", errors="replace")
        # The children read the bind too: unless REGATTA_PUBLIC_URL says
        # otherwise, the worker hands ranks this address to report to.
        self.env = {**os.environ, "REGATTA_BIND": bind, "PYTHONUNBUFFERED": "1"}
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        started = time.monotonic()
        # What happened since start-up began is said once the web is up.
        self.last_event = _newest_event()
        try:
            if settings.EMBEDDED_REDIS:
                redis_proc = start_redis(settings.EMBEDDED_REDIS_SOCKET)
                if redis_proc is not None:
                    self.procs.append(("redis", redis_proc))
            # The web first, alone on the CPUs while it starts: it is what a
            # person waits for. Then the worker and beat, and the fleet's torch.
            self._start_web(bind, web_workers)
            if self._wait_for_web(started):
                self._say_welcome(_since_start(started))
                self._start_worker_and_beat()
                # What waits for beat's first tick is looked at now: a job
                # submitted before the broker ran (the demo's), the fleet's nodes.
                self._kick()
                if install_fleet:
                    self._install_fleet()
                self._watch()
        finally:
            self._shutdown()

    # --- start-up -------------------------------------------------------------
    def _start_web(self, bind: str, web_workers: int) -> None:
        host, _, port = bind.rpartition(":")
        self._spawn("web", [
            sys.executable, "-m", "granian", "--interface", "wsgi", "--no-ws",
            "--host", host.strip("[]"), "--port", port, "--workers", str(web_workers),
            "--blocking-threads", "4", "--respawn-failed-workers", "--access-log",
            "--log-level", "warning", "--workers-kill-timeout", "5",
            "--factory", "controlplane.wsgi:serve",
        ])

    def _start_worker_and_beat(self) -> None:
        self._spawn("worker", [
            sys.executable, "-m", "celery", "-A", "controlplane", "worker",
            "--loglevel", "INFO", "--concurrency", "2", "--without-gossip",
            "--without-mingle", "-n", "worker@%h",
        ])
        self._spawn("beat", [
            sys.executable, "-m", "celery", "-A", "controlplane", "beat",
            "--loglevel", "INFO", "-s", settings.CELERY_BEAT_SCHEDULE_FILENAME,
        ])

    def _kick(self) -> None:
        from clusters.tasks import sweep_clusters
        from jobs.tasks import sweep_admission, sweep_jobs

        try:
            sweep_clusters.delay()
            sweep_jobs.delay()
            sweep_admission.delay()
        except Exception as exc:  # noqa: BLE001 - beat's sweeps come anyway
            self._alarm(f"could not send the first sweeps ({exc}); beat sends them in "
                        f"{settings.SWEEP_INTERVAL_S:g} s")

    def _wait_for_web(self, started: float) -> bool:
        url = f"http://{self.bind}/login/"
        while not self.stopping and time.monotonic() - started < UP_TIMEOUT_S:
            if self._child_died():
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        if not self.stopping:
            self._alarm(f"the web did not answer on {url} within {UP_TIMEOUT_S:.0f} s; "
                        f"see {self.log_path}")
        return False

    def _say_welcome(self, seconds: float | None = None) -> None:
        bind = self.bind
        lines = [self.style.SUCCESS(
            f"Regatta is up{f' in {seconds:.1f} s' if seconds is not None else ''}: "
            f"open http://{bind}/")]
        sign_in = demo_sign_in(Path(settings.STATE_DIR))
        if sign_in.password:
            lines.append(f"  sign in:    {sign_in.user} / {sign_in.password}")
        if sign_in.token:
            lines.append(f"  API token:  {sign_in.token}  (kept in {sign_in.token_file})")
        lines += [
            f"  admin:      http://{bind}/admin/   API docs: http://{bind}/api/docs/",
            f"  logs:       {self.log_path} (--verbose prints them here)",
            "  Enter prints this again; Ctrl-C stops everything.",
        ]
        self._say("\n".join(lines))

    # --- the fleet's torch ----------------------------------------------------
    def _install_fleet(self) -> None:
        self.installer = worker_env.Installer(
            worker_env.fleet_env_argv(), Path(settings.STATE_DIR) / "logs" / "fleet-env.log",
            say=self._say_line)

        def run():
            began = time.monotonic()
            ok = self.installer.run()
            if self.stopping:
                return
            if ok:
                self._say_line(f"the fleet's torch is installed ({time.monotonic() - began:.0f} s):"
                               " its jobs can start")
                self._kick()
            else:
                self._alarm(worker_env.describe(worker_env.read_status()))

        self._say_line("installing the fleet's torch behind the web (jobs wait for it; "
                       "progress here and on the fleet page)")
        threading.Thread(target=run, name="fleet-env", daemon=True).start()

    def _warm_fleet(self) -> None:
        """Warm standbys on every idle node of the local fleet, so the first
        job launches into processes that have imported torch already. One
        torch import for the whole fleet: the first standby forks the
        others' once its imports are done (regatta/node/standby.py)."""
        from clusters.providers import pool_info
        from jobs.admission import busy_node_ids

        try:
            for cluster in Cluster.objects.filter(provider=Cluster.Provider.LOCAL):
                provider = get_provider(cluster)
                if provider.environment_waiting():
                    continue
                busy = busy_node_ids(cluster.id)
                for pool in cluster.pools.all():
                    idle = [n.name for n in pool.nodes.filter(state="ready").order_by("name")
                            if n.id not in busy]
                    cold = [n for n in idle if standby.state(provider.root, n) != "ready"]
                    if cold:
                        provider.hold_spares(pool_info(pool), cold)
        except Exception as exc:  # noqa: BLE001 - cold launches still work
            self._alarm(f"could not start the fleet's warm standbys: {exc}")
        finally:
            close_old_connections()

    # --- the console ----------------------------------------------------------
    def _say(self, text: str) -> None:
        with self.say_lock:
            self.stdout.write(text)
            self.stdout.flush()

    def _say_line(self, text: str) -> None:
        self._say(f"{time.strftime('%H:%M:%S')} {text}")

    def _alarm(self, text: str) -> None:
        with self.say_lock:
            self.stderr.write(f"{time.strftime('%H:%M:%S')} {text}")
            self.stderr.flush()

    def _watch(self) -> None:
        last_event = self.last_event
        if sys.stdin is not None and sys.stdin.isatty():
            threading.Thread(target=self._on_enter, name="stdin", daemon=True).start()
        next_look = next_warm = 0.0
        while not self.stopping:
            if self._child_died():
                break
            if time.monotonic() >= next_look:
                last_event = self._say_state_changes(last_event)
                next_look = time.monotonic() + 1.0
            if time.monotonic() >= next_warm:
                # Nodes appear with the cluster's first pass and come back
                # idle when a job ends; each gets its standby within this.
                self._warm_fleet()
                next_warm = time.monotonic() + WARM_EVERY_S
            time.sleep(0.25)

    def _say_state_changes(self, after: int) -> int:
        try:
            changes = [e for e in JobEvent.objects.filter(id__gt=after).exclude(to_phase="")
                       .select_related("job").order_by("id")[:200]
                       if e.to_phase != e.from_phase]
            newest = JobEvent.objects.filter(id__gt=after).order_by("-id").values_list(
                "id", flat=True).first()
        except DatabaseError:
            return after  # a busy database: the next look says it
        finally:
            close_old_connections()
        for event in changes:
            message = f" — {event.message}" if event.message else ""
            self._say_line(f"job #{event.job_id} {event.job.name}: {event.from_phase or 'new'} → "
                           f"{event.to_phase}{message}"[:400])
        return newest or after

    def _on_enter(self) -> None:
        for _ in sys.stdin:
            if self.stopping:
                return
            self._say_welcome()

    def _child_died(self) -> bool:
        for name, proc in self.procs:
            if proc.poll() is not None:
                self._alarm(f"{name} exited with {proc.returncode}; stopping (see {self.log_path})")
                self.stopping = True
                return True
        return False

    def _on_signal(self, signum, frame):
        self.stopping = True

    def _spawn(self, name, argv):
        # Each child leads its own process group, so stopping it takes its
        # children (granian's and celery's workers) along. What it prints
        # goes to the log file, and to the console when it is an alarm.
        proc = subprocess.Popen(argv, start_new_session=True, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        self.procs.append((name, proc))
        threading.Thread(target=self._relay, args=(name, proc.stdout), name=f"log-{name}",
                         daemon=True).start()

    def _relay(self, name: str, stream) -> None:
        in_traceback = False
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            try:
                self.log.write(f"{name} | {line}\n")
            except ValueError:  # closed as this process exits
                return
            if self.verbose:
                self._say(f"{name} | {line}")
                continue
            if in_traceback:
                # The frames are indented; the exception's line ends it.
                in_traceback = line[:1].isspace()
                self._alarm(f"{name} | {line}")
            elif ALARM.search(line) and not CLIENT_ERROR.search(line):
                in_traceback = line.startswith("Traceback")
                self._alarm(f"{name} | {line}")

    def _shutdown(self):
        self._say("stopping training ranks, web, worker, beat …")
        if self.installer is not None:
            self.installer.stop()
        stop_local_training()
        # The broker last: a task still running in the worker as it stops
        # would fail on a broker gone before it.
        apps = [p for name, p in self.procs if name != "redis"]
        broker = [p for name, p in self.procs if name == "redis"]
        for group in (apps, broker):
            # The leader alone: Celery and granian stop their own workers
            # (a warm shutdown); a signal to the whole group would kill a
            # worker mid-task, which Celery reports as an error.
            for proc in reversed(group):
                _signal(proc, signal.SIGTERM)
            deadline = time.monotonic() + 15
            for proc in reversed(group):
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
            if group is apps:
                # A launch the worker was carrying out as it stopped may have
                # started ranks (and a node's next standby) after the first
                # stop: those are stopped now that no task can start more.
                stop_local_training(grace_s=5.0)
        for _, proc in self.procs:
            _signal_group(proc, signal.SIGKILL)  # stragglers of a group leader gone first
        self._say("stopped.")


def _newest_event() -> int:
    return JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _since_start(started: float) -> float:
    """Seconds since `./run` began (it exports the time), else since this
    command began."""
    try:
        return time.time() - float(os.environ["REGATTA_STARTED_AT"])
    except (KeyError, ValueError):
        return time.monotonic() - started


def _host_port(value: str) -> str:
    try:
        return parse_host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--bind {exc}") from None


def _signal(proc, sig):
    try:
        proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


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
    # Their warm standbys (regatta/node/standby.py) are detached too.
    for cluster in Cluster.objects.filter(provider="local"):
        get_provider(cluster).stop_standbys()
