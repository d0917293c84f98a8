"""`./run` as a new user runs it, timed to the demo job's first step:

    DEMO_ARGS="--devices cuda --nodes 1 --spares 1" ./run

starts on a fresh state folder (set-up, migrate, the demo world and its
job, web, worker, beat, the fleet), and this script watches it through the
REST API with the demo token `./run` keeps in the state folder: when the
web answers, and each step of the demo job's way to its first step
(Submitted, Admitted, the preflight, Launched, StartupReport, Running) by
the server's own timestamps, and the first loss point. Then SIGINT to
`./run`'s one process, as a supervisor sends it, and a look for anything
left running.

    python bench/demo_first_step.py --devices cuda --out $OUT [--limit-s 150]

`--venv DIR` is the virtualenv `./run` uses (its VENV): on a machine whose
Python already holds the packages (the GPU machine's, with the control plane
on PYTHONPATH) it is that Python's prefix, with the Makefile's stamps in it.
Without `make` it runs what `./run` runs, one command at a time. A run that
does not reach its first step in time writes where everything stood
(bench/product_dump.py). Files: DIR/demo_first_step.json and .txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import product_dump  # noqa: E402 - beside this script
from gpu_product import Api, free_port, results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MILESTONES = ("Submitted", "Queued", "Admitted", "PreflightPassed", "PreflightSkipped",
              "PreflightFailed", "Launched", "StartupReport", "Running")


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Demo:
    def __init__(self, args):
        self.args = args
        self.state = Path(args.state or tempfile.mkdtemp(prefix="regatta-demo-"))
        self.port = free_port()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.limit_s
        self.figures: dict[str, object] = {"devices": args.devices}
        self.console = self.state / "run-console.txt"
        self.proc: subprocess.Popen | None = None
        self.api: Api | None = None
        self.job_id: int | None = None
        self.dumped = ""

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def left(self) -> float:
        return self.deadline - 25.0 - time.monotonic()  # kept for the dump and the stop

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL", "REGATTA_PUBLIC_URL", "REGATTA_BIND")}
        path = [str(ROOT / "worker_image")] + [p for p in env.get("PYTHONPATH", "").split(
            os.pathsep) if p]
        env.update(REGATTA_STATE_DIR=str(self.state), PYTHONPATH=os.pathsep.join(path),
                   PYTHONUNBUFFERED="1", DEMO_ARGS=f"--devices {self.args.devices} --nodes 1 "
                   "--spares 1")
        if self.args.venv:
            env["VENV"] = self.args.venv
        bind = f"127.0.0.1:{self.port}"
        if shutil.which("make"):
            argv = ["./run", "--bind", bind]
            self.figures["how"] = "./run"
        else:
            # What ./run runs, for a machine without make.
            py = os.path.join(self.args.venv, "bin", "python") if self.args.venv else sys.executable
            argv = ["sh", "-c", f"{py} manage.py migrate --noinput -v0 && {py} manage.py "
                    f"regatta_demo $DEMO_ARGS && exec {py} manage.py regatta_up --bind {bind}"]
            self.figures["how"] = "./run's commands (no make here)"
        with open(self.console, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def until(self, what: str, probe, every: float = 0.5):
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"./run exited {self.proc.returncode} before {what}")
            value = probe()
            if value:
                return value
            if self.left() <= 0:
                raise TimeoutError(f"{what}: not within the run's {self.args.limit_s:.0f} s")
            time.sleep(every)

    def watch(self) -> None:
        token_file = self.state / "demo-token"
        token = self.until("the demo token", lambda: token_file.exists()
                           and token_file.read_text().strip())
        api = self.api = Api(f"http://127.0.0.1:{self.port}/api/v1/", token)

        def web_up():
            try:
                return api.call("GET", "me/")[0] == 200
            except OSError:
                return False
        self.until("the web answers", web_up)
        self.figures["web_up_s"] = self.elapsed()
        job = self.until("the demo job", lambda: results(api.get("jobs/")))[0]
        self.job_id = job["id"]

        def first_step():
            events = results(api.get(f"jobs/{self.job_id}/events/"))
            return events if any(e["kind"] == "Running" for e in events) else None
        events = self.until("the demo job's first step", first_step)
        self.figures["first_step_s"] = self.elapsed()
        submitted = at(next(e for e in events if e["kind"] == "Submitted")["created_at"])
        self.figures["milestones_s"] = {
            e["kind"]: round(at(e["created_at"]) - submitted, 2) for e in events
            if e["kind"] in MILESTONES}
        self.figures["submit_to_first_step_s"] = self.figures["milestones_s"]["Running"]

        def loss():
            return api.get(f"jobs/{self.job_id}/metrics/?name=loss&points=10")["points"]
        points = self.until("a first loss point", loss)
        self.figures["first_loss_point_s"] = self.elapsed()
        self.figures["first_loss_step"] = points[0][0]
        backend = [line for line in self.logs() if "training " in line and "params" in line]
        self.figures["started"] = backend[:1]

    def logs(self) -> list[str]:
        lines = []
        for log in sorted((self.state / "fleet").glob("local/attempts/*/node-*/stdout.log")):
            lines += log.read_text(errors="replace").splitlines()
        return lines

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # the one PID a supervisor signals
        began = time.monotonic()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        time.sleep(1)
        left = [line for line in subprocess.run(["pgrep", "-af", str(self.state)],
                                                capture_output=True, text=True).stdout.splitlines()
                if int(line.split()[0]) != os.getpid()]
        self.figures["stop"] = (f"SIGINT: exit {self.proc.returncode} in "
                                f"{time.monotonic() - began:.1f} s, "
                                f"{'left running: ' + '; '.join(left) if left else 'nothing left'}")

    def write(self, ok: bool, why: str) -> None:
        self.figures.update(ok=ok, why=why, total_s=self.elapsed())
        print(json.dumps(self.figures, indent=1), flush=True)
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "demo_first_step.json").write_text(json.dumps(self.figures, indent=1))
        with open(out / "demo_first_step.txt", "wb") as txt:
            txt.write(json.dumps(self.figures, indent=1).encode() + b"\n")
            if self.dumped:
                txt.write(self.dumped.encode(errors="replace"))
            ranks = sorted((self.state / "fleet").glob("local/attempts/*/node-*/stdout.log"))
            for path in [self.console, self.state / "logs" / "regatta.log", *ranks]:
                if path.exists():
                    txt.write(f"\n==> {path.relative_to(self.state)}\n".encode())
                    txt.write(path.read_bytes()[-2**18:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--out", required=True)
    p.add_argument("--limit-s", type=float, default=150.0)
    p.add_argument("--venv", help="the virtualenv ./run uses (VENV)")
    p.add_argument("--state", help="state folder, kept (default: a temporary one, removed)")
    args = p.parse_args()
    demo = Demo(args)
    ok, why = False, ""
    try:
        demo.start()
        demo.watch()
        ok = True
    except (Exception, KeyboardInterrupt) as exc:
        why = f"{type(exc).__name__}: {exc}"
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            demo.dumped = product_dump.dump(demo.api, demo.job_id, demo.state, why)
        finally:
            signal.signal(signal.SIGINT, previous)
        print(demo.dumped[-8000:], flush=True)
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            demo.stop()
        finally:
            signal.signal(signal.SIGINT, previous)
    demo.write(ok, why)
    if not args.state:
        shutil.rmtree(demo.state, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
