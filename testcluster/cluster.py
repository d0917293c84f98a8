"""Starts and stops the cluster's processes in a state folder.

Every process listens on a free loopback port, writes its log to
`<state>/logs/` and its pid to `<state>/pids/`, so `down` (or a crashed test
session's next `up`) stops exactly what this folder started. The components
authenticate with static tokens (`<state>/tokens.csv`): the scheduler and the
controller-manager as their own users, so the API server's bootstrap RBAC
roles bind them as in a real cluster; kwok and the training-operator as
cluster admins, the rights their own deployments' ClusterRoles grant.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from . import build, pidfiles, pki
from .ports import free_ports

NAMESPACE_OPERATOR = "kubeflow"
# The serving certificate's Secret and webhook configuration the
# training-operator's cert rotator manages (its manifests/base/webhook).
OPERATOR_WEBHOOK_SECRET = "training-operator-webhook-cert"
OPERATOR_WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
# kwok manages only the nodes annotated so (testcluster/fleet.py adds it).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"


class ClusterError(RuntimeError):
    pass


@dataclass
class Endpoints:
    api_port: int
    etcd_port: int
    etcd_peer_port: int
    kwok_port: int
    webhook_port: int
    jobset_webhook_port: int
    trainer_webhook_port: int
    kueue_webhook_port: int

    @classmethod
    def pick(cls) -> Endpoints:
        return cls(*free_ports(len(fields(cls))))

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"


class TestCluster:
    """One cluster in one state folder."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, state: Path, bin_dir: Path | None = None):
        self.state = Path(state).resolve()
        self.bin_dir = bin_dir
        self.logs = self.state / "logs"
        self.pids = self.state / "pids"

    # --- files ----------------------------------------------------------------
    @property
    def admin_kubeconfig(self) -> Path:
        return self.state / "admin.kubeconfig"

    def _endpoints_file(self) -> Path:
        return self.state / "endpoints.json"

    def endpoints(self) -> Endpoints:
        return Endpoints(**json.loads(self._endpoints_file().read_text()))

    def _tokens(self) -> dict[str, str]:
        path = self.state / "tokens.json"
        if path.exists():
            return json.loads(path.read_text())
        tokens = {who: secrets.token_hex(24) for who in
                  ("admin", "kube-scheduler", "kube-controller-manager")}
        path.write_text(json.dumps(tokens))
        path.chmod(0o600)
        # token,user,uid,"groups"
        rows = [f'{tokens["admin"]},regatta-testcluster-admin,admin,"system:masters"',
                f'{tokens["kube-scheduler"]},system:kube-scheduler,kube-scheduler',
                f'{tokens["kube-controller-manager"]},system:kube-controller-manager,'
                'kube-controller-manager']
        csv = self.state / "tokens.csv"
        csv.write_text("\n".join(rows) + "\n")
        csv.chmod(0o600)
        return tokens

    def write_kubeconfig(self, path: Path, token: str, user: str) -> Path:
        ep = self.endpoints()
        ca = self.state / "pki" / "ca.crt"
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "regatta-testcluster",
            "clusters": [{"name": "regatta-testcluster",
                          "cluster": {"server": ep.api_url, "certificate-authority": str(ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "regatta-testcluster",
                          "context": {"cluster": "regatta-testcluster", "user": user}}],
        }
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    # --- processes --------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict | None = None) -> None:
        log = open(self.logs / f"{name}.log", "ab")
        proc = subprocess.Popen(
            [str(self.bin_dir / name), *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=self.state, env={**os.environ, **(env or {})},
            # Its own session: a Ctrl-C in the terminal that ran `make kube-up`
            # does not take the cluster down; `down` does.
            start_new_session=True,
        )
        log.close()
        self._procs[name] = proc
        pidfiles.record(self.pids, name, proc.pid, str(self.bin_dir / name))

    def running(self) -> dict[str, int]:
        """Live processes this folder started (see pidfiles.running)."""
        return pidfiles.running(self.pids)

    def down(self) -> None:
        """Stops every process this state folder started, last started first."""
        order = ["kueue", "trainer-controller-manager", "jobset", "training-operator", "kwok",
                 "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
        alive = self.running()
        for name in sorted(alive, key=lambda n: order.index(n) if n in order else -1):
            try:
                os.kill(alive[name], signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.running():
            time.sleep(0.1)
        for pid in self.running().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pidfile in self.pids.glob("*.pid") if self.pids.exists() else ():
            pidfile.unlink()

    def _wait(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except Exception as exc:  # noqa: BLE001 - shown if it never comes up
                last = exc
            # The processes this call started, asked directly: a pid's
            # /proc entry is the wrong witness for a child of ours.
            dead = {n: p.returncode for n, p in self._procs.items() if p.poll() is not None}
            if dead:
                name, code = next(iter(dead.items()))
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                raise ClusterError(f"{', '.join(dead)} exited ({how}) while waiting for {what}; "
                                   f"see {self.logs}/{name}.log:\n{self._tail(name)}")
            time.sleep(0.1)
        raise ClusterError(f"timed out waiting for {what} ({last})")

    def _tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace")
                             .splitlines()[-lines:])
        except OSError:
            return ""

    def _api_ok(self, path: str, token: str) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.state / "pki" / "ca.crt"))
        req = urllib.request.Request(self.endpoints().api_url + path,
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            return resp.status == 200

    def up(self, log=print) -> Path:
        """Starts the cluster (stopping whatever this folder ran before) and
        returns the admin kubeconfig. Idempotent only in that sense: a second
        `up` is a fresh cluster, since etcd's data starts empty."""
        if self.bin_dir is None:
            self.bin_dir = build.build(log=log)
        self.down()
        try:
            return self._start(log)
        except BaseException:
            # Nothing of a start that failed runs on: its processes would
            # outlive the caller (a test session whose fixture never yielded
            # left an API server and etcd running into the next run).
            self.down()
            raise

    def _start(self, log) -> Path:
        for sub in ("logs", "pids", "etcd"):
            path = self.state / sub
            if sub == "etcd" and path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, subprocess.Popen] = {}
        paths = pki.ensure(self.state / "pki")
        tokens = self._tokens()
        ep = Endpoints.pick()
        self._endpoints_file().write_text(json.dumps(ep.__dict__))
        self.write_kubeconfig(self.admin_kubeconfig, tokens["admin"], "admin")
        scheduler_kc = self.write_kubeconfig(self.state / "scheduler.kubeconfig",
                                             tokens["kube-scheduler"], "kube-scheduler")
        cm_kc = self.write_kubeconfig(self.state / "controller-manager.kubeconfig",
                                      tokens["kube-controller-manager"],
                                      "kube-controller-manager")
        started = time.monotonic()

        etcd_url = f"http://127.0.0.1:{ep.etcd_port}"
        peer_url = f"http://127.0.0.1:{ep.etcd_peer_port}"
        self._spawn("etcd", [
            "--name=testcluster", f"--data-dir={self.state / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=testcluster={peer_url}",
            # A throwaway cluster: durability is not worth an fsync per write.
            "--unsafe-no-fsync", "--log-level=warn",
        ])
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={ep.api_port}",
            f"--tls-cert-file={paths['apiserver.crt']}",
            f"--tls-private-key-file={paths['apiserver.key']}",
            f"--client-ca-file={paths['ca.crt']}",
            f"--token-auth-file={self.state / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={paths['sa.pub']}",
            f"--service-account-signing-key-file={paths['sa.key']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The `kubernetes` Service's endpoints would be this loopback
            # address, which Endpoints validation rejects; nothing here needs it.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ])
        self._wait("the API server", lambda: self._api_ok("/readyz", tokens["admin"]), 60)
        log(f"testcluster: API server ready at {ep.api_url} "
            f"({time.monotonic() - started:.1f} s)")

        self._spawn("kube-controller-manager", [
            f"--kubeconfig={cm_kc}", f"--authentication-kubeconfig={cm_kc}",
            f"--authorization-kubeconfig={cm_kc}",
            "--leader-elect=false", "--secure-port=0",
            # Each controller acts with its own ServiceAccount's token, as kubeadm sets it up.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={paths['sa.key']}",
            f"--root-ca-file={paths['ca.crt']}",
            "--controllers=*", "--v=1",
        ])
        self._spawn("kube-scheduler", [
            f"--kubeconfig={scheduler_kc}", f"--authentication-kubeconfig={scheduler_kc}",
            f"--authorization-kubeconfig={scheduler_kc}",
            "--leader-elect=false", "--secure-port=0", "--v=1",
        ])
        self._spawn("kwok", [
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--config={self._kwok_config()}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=" + "=".join(KWOK_NODE_ANNOTATION),
            f"--server-address=127.0.0.1:{ep.kwok_port}",
            "--node-lease-duration-seconds=40",
        ])
        from . import bootstrap

        bootstrap.install_operator_prerequisites(self)
        self._spawn("training-operator", [
            "--enable-scheme=pytorchjob",
            "--metrics-bind-address=0", "--health-probe-bind-address=0",
            f"--webhook-server-port={ep.webhook_port}",
            # deploy/training-operator's init container (requests = limits),
            # from the same ConfigMap a platform applies.
            f"--pytorch-init-container-template-file={self._init_container_template()}",
        ], env={"KUBECONFIG": str(self.admin_kubeconfig),
                "MY_POD_NAMESPACE": NAMESPACE_OPERATOR})
        bootstrap.wait_ready(self)
        self._start_controllers(ep, paths["ca.crt"])
        log(f"testcluster: cluster ready ({time.monotonic() - started:.1f} s); "
            f"admin kubeconfig {self.admin_kubeconfig}")
        return self.admin_kubeconfig

    def _start_controllers(self, ep: Endpoints, ca: Path) -> None:
        """The JobSet controller, Kubeflow Trainer v2 (trainer_v2.py) and Kueue
        (kueue.py), side by side: their CRDs, the three controllers, then
        their webhooks, once each serves. Kueue looks for the Trainer's and
        JobSet's CRDs when it sets up those integrations, so all CRDs come
        first."""
        from . import bootstrap, kueue, trainer_v2, webhooks

        api = bootstrap.api_client(self.admin_kubeconfig)
        crds = [*trainer_v2.crd_docs(),
                *kueue.crd_docs(ep.kueue_webhook_port, ca.read_bytes())]
        bootstrap.apply(api, [*crds, kueue.namespace_doc()])
        names = [doc["metadata"]["name"] for doc in crds]
        self._wait("the Trainer's, JobSet's and Kueue's CRDs",
                   lambda: bootstrap.established(api, names), 60)
        ports = {trainer_v2.TRAINER: ep.trainer_webhook_port,
                 trainer_v2.JOBSET: ep.jobset_webhook_port}
        controllers = {**trainer_v2.configure(self.state, ports),
                       "kueue": kueue.configure(self.state, ep.kueue_webhook_port)}
        for name, how in controllers.items():
            # Cluster admins, as the ClusterRoles of their own deployments allow.
            self._spawn(name, how["args"],
                        env={"KUBECONFIG": str(self.admin_kubeconfig), **how["env"]})
        # Kueue names its reconcilers by logger: the Workloads', and the two
        # job kinds Regatta makes.
        for name, controller in (("jobset", "jobset"),
                                 ("trainer-controller-manager", "trainjob_controller"),
                                 ("kueue", "workload-reconciler"), ("kueue", "pytorchjob"),
                                 ("kueue", "trainjob")):
            self._wait(f"{name}'s {controller}",
                       lambda n=name, c=controller: self._workers_started(n, c), 90)
        for what, port in ((trainer_v2.TRAINER, ep.trainer_webhook_port),
                           (trainer_v2.JOBSET, ep.jobset_webhook_port),
                           ("Kueue", ep.kueue_webhook_port)):
            self._wait(f"{what}'s webhook server", lambda p=port: webhooks.serving(p, ca), 30)
        bootstrap.apply(api, [
            *trainer_v2.webhook_configurations(ports, ca.read_bytes()),
            *kueue.webhook_configurations(ep.kueue_webhook_port, ca.read_bytes())])

    def _workers_started(self, name: str, controller: str) -> bool:
        # zap writes `"controller": "x"` in console form and `"controller":"x"` in
        # JSON; Kueue names its reconcilers by their logger instead.
        marker = re.compile(rf'"(?:controller|logger)":\s?"{re.escape(controller)}"')
        return any("Starting workers" in line and marker.search(line)
                   for line in (self.logs / f"{name}.log").read_text(errors="replace")
                   .splitlines())

    def _init_container_template(self) -> Path:
        from . import bootstrap

        (doc,) = yaml.safe_load_all(
            (bootstrap.REPO / "deploy" / "training-operator" / "init-container.yaml").read_text())
        path = self.state / "initContainer.yaml"
        path.write_text(doc["data"]["initContainer.yaml"])
        return path

    def _kwok_config(self) -> Path:
        from . import stages

        path = self.state / "kwok.yaml"
        path.write_text(stages.kwok_config())
        return path
