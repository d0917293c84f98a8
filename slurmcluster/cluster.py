"""Starts and stops a one-machine Slurm in a state folder.

munged (as the munge user, with its own key and socket), the accounting
(MariaDB as the mysql user, with its data in the folder, and slurmdbd: what
`sacct` reads), slurmctld and one `slurmd -N nX` per emulated node, all in
the foreground of processes this module starts in sessions of their own,
like testcluster/cluster.py: logs in `<state>/log/`, pids in `<state>/pids/`
(with the binary, so a pid reused after a crash is never signalled), so
`down` or the next `up` stops exactly what this folder started. Every port
is a free loopback port picked at `up`.

Root only: slurmd must be root to start job steps as their user; munged and
MariaDB run as the munge and mysql users that Debian's packages create. Those
two must pass through every folder above their own: when the state folder
is private to root (`mktemp -d`, mode 0700), their folders (munge's key,
socket and log; MariaDB's data, socket and pid) go to a folder of this
cluster's own under /tmp instead, root's, which they may pass through but
not list (`daemon_dir`); the rest stays in the state folder.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from testcluster import pidfiles
from testcluster.ports import free_ports

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
           "slurmd": "/usr/sbin/slurmd", "slurmdbd": "/usr/sbin/slurmdbd",
           "mariadbd": "/usr/sbin/mariadbd"}
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun", "sacct", "sacctmgr",
           "mariadb", "mariadb-install-db")
PACKAGES = "slurmctld slurmd slurm-client munge slurmrestd slurmdbd mariadb-server"
# The accounting database's account for slurmdbd: on loopback only, in a
# database that lives and dies with the state folder.
DB_USER, DB_PASSWORD, DB_NAME = "slurm", "regatta-slurmdbd", "slurm_acct_db"
CLUSTER_NAME = "regatta"
# `down` stops daemons in this order (unlisted, the slurmds: first); munged
# goes last, since slurmctld and slurmdbd authenticate through it.
_STOP_ORDER = {"slurmctld": 1, "slurmdbd": 2, "mariadbd": 3, "munged": 4}
ENABLE_HINT = (f"apt-get install -y --no-install-recommends {PACKAGES} (as root) to enable "
               "the real-Slurm tests")
# Unix socket paths are limited to 108 bytes, munge's included.
_SOCKET_PATH_MAX = 100
# The daemons that run as users of their own, not root.
DAEMON_USERS = ("munge", "mysql")
# Where their folders go when the state folder is closed to them.
DAEMON_PARENT = Path("/tmp")


class SlurmClusterError(RuntimeError):
    pass



def why_unavailable() -> str | None:
    """Why a Slurm cannot start here, or None."""
    missing = [p for p in DAEMONS.values() if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return f"Slurm's packages are missing ({', '.join(missing)}): {ENABLE_HINT}"
    if os.geteuid() != 0:
        return "the one-machine Slurm needs root (slurmd starts job steps as their user)"
    for user in ("munge", "mysql"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no {user} user: {ENABLE_HINT}"
    return None


def passes_into(path: Path, user: str) -> bool:
    """Whether `user` may pass through every folder from / down to `path`
    (down to its nearest existing folder), by the mode bits the kernel
    checks: the owner's, the group's, or everyone's search bit."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return True  # no such user: why_unavailable says so
    gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    folder = Path(path)
    while not folder.exists():
        folder = folder.parent
    for each in (folder, *folder.parents):
        info = each.stat()
        if info.st_uid == entry.pw_uid:
            bit = stat.S_IXUSR
        elif info.st_gid in gids:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return False
    return True


@dataclass(frozen=True)
class NodeSpec:
    name: str
    partition: str
    port: int
    gpus: int = 2
    cpus: int = 2
    features: str = ""


@dataclass(frozen=True)
class Layout:
    """The emulated nodes: `working` in partition `gpu` (the default) and
    `spares` in partition `spare`, each with `gpus` fake GPUs."""

    ctld_port: int
    nodes: tuple[NodeSpec, ...]
    dbd_port: int = 0  # slurmdbd
    db_port: int = 0  # MariaDB

    @classmethod
    def pick(cls, working: int = 4, spares: int = 2, gpus: int = 2) -> Layout:
        ctld, dbd, db, *node_ports = free_ports(3 + working + spares)
        nodes = tuple(
            NodeSpec(name=f"n{i}", partition="gpu" if i <= working else "spare",
                     port=port, gpus=gpus)
            for i, port in enumerate(node_ports, start=1))
        return cls(ctld_port=ctld, nodes=nodes, dbd_port=dbd, db_port=db)

    def partition(self, name: str) -> list[str]:
        return [n.name for n in self.nodes if n.partition == name]


class SlurmCluster:
    """One Slurm in one state folder."""

    def __init__(self, state: Path):
        self.state = Path(state).resolve()
        self.log_dir = self.state / "log"
        self.pids = self.state / "pids"
        self.conf = self.state / "etc" / "slurm.conf"
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def daemon_dir(self) -> Path:
        """Where munged's and MariaDB's folders go: the state folder when
        their users can pass into it, else this cluster's own folder under
        /tmp (named after the state folder, so `down` in another process
        finds the same one)."""
        if all(passes_into(self.state, user) for user in DAEMON_USERS):
            return self.state
        digest = hashlib.sha256(str(self.state).encode()).hexdigest()[:12]
        return DAEMON_PARENT / f"regatta-slurm-{digest}"

    @property
    def munge_dir(self) -> Path:
        return self.daemon_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_log(self) -> Path:
        # munged opens its log itself, as the munge user.
        return (self.log_dir if self.daemon_dir == self.state else self.munge_dir) / \
            "munged.log"

    def _prepare_daemon_dir(self) -> None:
        """Make the folder of `daemon_dir` outside the state folder: root's,
        passable but not listable or writable by others. One already there
        must be just that (a folder in /tmp anyone could have made first)."""
        folder = self.daemon_dir
        if folder == self.state:
            return
        try:
            folder.mkdir(mode=0o711)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            raise SlurmClusterError(
                f"{folder} is not a folder of root's that only root may write; remove it")
        folder.chmod(0o711)
        closed = [u for u in DAEMON_USERS if not passes_into(folder / "x", u)]
        if closed:
            raise SlurmClusterError(
                f"munged and MariaDB run as the users {' and '.join(DAEMON_USERS)}, and "
                f"{', '.join(closed)} can pass neither into {self.state} nor into {folder}: "
                "give them search permission on the folders above one of them (chmod o+x), "
                "or put REGATTA_STATE_DIR where they can reach it")

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def layout(self) -> Layout:
        raw = json.loads((self.state / "layout.json").read_text())
        return Layout(**{**raw, "nodes": tuple(NodeSpec(**n) for n in raw["nodes"])})

    # --- configuration ----------------------------------------------------
    def _write_munge_key(self) -> None:
        munge = pwd.getpwnam("munge")
        self.munge_dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        self.munge_dir.chmod(0o700)
        key = self.munge_dir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chown(key, munge.pw_uid, munge.pw_gid)
        key.chmod(0o600)

    def _write_conf(self, layout: Layout) -> None:
        host = socket.gethostname().split(".")[0]
        state = self.state
        fakedev = state / "fakedev"
        fakedev.mkdir(parents=True, exist_ok=True)
        gres_lines = []
        first = 0
        for node in layout.nodes:
            for i in range(first, first + node.gpus):
                (fakedev / f"nvidia{i}").touch()
            # Empty files are enough: a count-only Gres line leaves the node
            # INVAL ("gres/gpu count reported lower than configured").
            gres_lines.append(f"NodeName={node.name} Name=gpu "
                              f"File={fakedev}/nvidia[{first}-{first + node.gpus - 1}]")
            first += node.gpus
        node_lines = [
            f"NodeName={n.name} NodeHostname={host} NodeAddr=127.0.0.1 Port={n.port} "
            f"CPUs={n.cpus} RealMemory=1000 Gres=gpu:{n.gpus} State=UNKNOWN"
            + (f" Feature={n.features}" if n.features else "")
            for n in layout.nodes]
        partitions = sorted({n.partition for n in layout.nodes})
        part_lines = [
            f"PartitionName={p} Nodes={','.join(layout.partition(p))} "
            f"Default={'YES' if p == 'gpu' else 'NO'} MaxTime=INFINITE State=UP"
            for p in partitions]
        conf = f"""\
ClusterName={CLUSTER_NAME}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={layout.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool/%n
SlurmctldPidFile={state}/run/slurmctld.pid
SlurmdPidFile={state}/run/slurmd-%n.pid
SlurmctldLogFile={self.log_dir}/slurmctld.log
SlurmdLogFile={self.log_dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# Jobs recorded by slurmdbd, for `sacct` (no usage gathered: states, exit
# codes, nodes and times are what Regatta and an operator compare).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={layout.dbd_port}
# Connections to slurmdbd read munge's socket from here, not from AuthInfo.
AccountingStoragePass={self.munge_socket}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
# The configured CPUs and memory count, whatever this machine has.
SlurmdParameters=config_overrides
# A node whose slurmd comes back rejoins by itself; one lost is DOWN after 10 s.
ReturnToService=2
SlurmdTimeout=10
# scancel's SIGKILL follows its SIGTERM after this long.
KillWait=10
# Ended jobs stay visible to `scontrol show job` this long.
MinJobAge=600
GresTypes=gpu
{chr(10).join(node_lines)}
{chr(10).join(part_lines)}
"""
        self.conf.parent.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(conf)
        (self.conf.parent / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        (self.state / "layout.json").write_text(json.dumps(asdict(layout)))

    def _write_dbd_conf(self, layout: Layout) -> Path:
        conf = self.conf.parent / "slurmdbd.conf"
        conf.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={layout.dbd_port}
SlurmUser=root
LogFile={self.log_dir}/slurmdbd.log
PidFile={self.state}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={layout.db_port}
StorageUser={DB_USER}
StoragePass={DB_PASSWORD}
StorageLoc={DB_NAME}
""")
        conf.chmod(0o600)  # slurmdbd refuses a readable one: it holds the password
        return conf

    # --- processes --------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], user: str | None = None) -> None:
        as_user = {}
        if user is not None:
            entry = pwd.getpwnam(user)
            as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        with open(self.log_dir / f"{name}.out", "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.state if user is None else self.daemon_dir,
                env={**os.environ, **self.env},
                # Its own session: a Ctrl-C in the terminal that ran `up`
                # leaves the cluster up; `down` stops it.
                start_new_session=True, **as_user,
            )
        self._procs[name] = proc
        pidfiles.record(self.pids, name, proc.pid, argv[0])

    def running(self) -> dict[str, int]:
        """Live daemons this folder started (see testcluster.pidfiles.running)."""
        return pidfiles.running(self.pids)

    def stop_daemon(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal one daemon (`slurmd-n3`, `slurmctld`): tests lose a node so."""
        pid = self.running()[name]
        os.kill(pid, sig)
        if name in self._procs:
            self._procs[name].wait(timeout=10)
        return pid

    def stop_slurmctld(self) -> int:
        """Stop the controller as an admin's restart does (SIGTERM: it saves
        its state first); the slurmds and the jobs' steps go on."""
        return self.stop_daemon("slurmctld", signal.SIGTERM)

    def start_slurmctld(self) -> None:
        """Start the controller again from its saved state (no -i): nodes
        and jobs come back as it left them, after their slurmds register."""
        self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-f", str(self.conf)])

    def start_slurmd(self, node: str) -> None:
        self._spawn(f"slurmd-{node}", [DAEMONS["slurmd"], "-D", "-N", node,
                                       "-f", str(self.conf)])

    def cancel_jobs(self) -> None:
        """Jobs die with their cluster: their steps (slurmstepd) outlive slurmd."""
        if "slurmctld" not in self.running():
            return
        env = {**os.environ, **self.env}
        subprocess.run(["scancel", "--full", "--quiet", "--state=RUNNING"], env=env,
                       timeout=15, capture_output=True)
        subprocess.run(["scancel", "--quiet", "--user=root"], env=env, timeout=15,
                       capture_output=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, timeout=15,
                                 capture_output=True, text=True)
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.2)

    def _job_tasks(self, **wanted: str) -> list[int]:
        """Pids of job processes of this cluster whose environment holds
        every `wanted` pair (Slurm's SLURM_* variables)."""
        wanted = {**wanted, "SLURM_CONF": str(self.conf)}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            env = dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if b"=" in item)
            if all(env.get(k.encode()) == v.encode() for k, v in wanted.items()):
                found.append(int(entry))
        return found

    def job_processes(self, job_id: str) -> list[int]:
        """The live processes of one job, on any node."""
        return [pid for pid in self._job_tasks(SLURM_JOB_ID=job_id) if _alive(pid)]

    def kill_node_processes(self, node: str) -> list[int]:
        """SIGKILL every job process on `node` and the slurmstepds above them,
        as a machine that lost power would: slurmstepd outlives slurmd."""
        tasks = self._job_tasks(SLURMD_NODENAME=node)
        steps = set()
        for pid in tasks:
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if Path(f"/proc/{ppid}/comm").read_text().startswith("slurmstepd"):
                    steps.add(ppid)
            except (OSError, ValueError, IndexError):
                continue
        victims = sorted(steps) + tasks
        for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGCONT):
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        return victims

    def lose_node(self, node: str) -> list[int]:
        """The node dies whole, as a machine that lost power: its slurmd and
        every job process on it, SIGKILLed. Returns the pids."""
        return [self.stop_daemon(f"slurmd-{node}"), *self.kill_node_processes(node)]

    def down(self) -> None:
        """Stops every daemon this folder started: jobs first, slurmds, then
        slurmctld and munged."""
        try:
            self.cancel_jobs()
        except (OSError, subprocess.SubprocessError):
            pass  # best effort: the daemons go below whatever happens here
        alive = self.running()
        order = sorted(alive, key=lambda n: _STOP_ORDER.get(n, 0))
        for name in order:
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
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for pidfile in self.pids.glob("*.pid") if self.pids.exists() else ():
            pidfile.unlink()
        self._remove_daemon_dir()

    def _remove_daemon_dir(self) -> None:
        """The folder outside the state folder goes with the daemons (the
        state folder's own copy stays, as ever, until the next `up`)."""
        folder = self.daemon_dir
        if folder == self.state:
            return
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0:
            shutil.rmtree(folder, ignore_errors=True)

    def _wait(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                last = exc
            dead = {n: p.returncode for n, p in self._procs.items() if p.poll() is not None}
            if dead:
                name, code = next(iter(dead.items()))
                raise SlurmClusterError(
                    f"{', '.join(dead)} exited ({code}) while waiting for {what}; see "
                    f"{self.log_dir}:\n{self.tail(name)}")
            time.sleep(0.2)
        raise SlurmClusterError(f"timed out waiting for {what} ({last}); see {self.log_dir}")

    def tail(self, name: str, lines: int = 30) -> str:
        texts = []
        paths = [self.log_dir / f"{name}.out", self.log_dir / f"{name}.log"]
        if name == "munged":
            paths.append(self.munge_log)
        for path in dict.fromkeys(paths):
            if path.exists():
                texts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(texts)

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env={**os.environ, **self.env},
                             capture_output=True, text=True, timeout=15, check=True)
        return dict(line.split() for line in out.stdout.splitlines() if line.strip())

    def up(self, working: int = 4, spares: int = 2, log=print) -> Path:
        """Starts a fresh cluster (stopping whatever this folder ran before,
        forgetting its jobs) and returns its slurm.conf."""
        if len(str(self.munge_socket)) > _SOCKET_PATH_MAX:
            raise SlurmClusterError(f"state folder too deep for munge's socket: {self.state}")
        self.down()
        self._prepare_daemon_dir()
        for sub in ("ctld", "spool", "run", "db"):
            shutil.rmtree(self.state / sub, ignore_errors=True)
            shutil.rmtree(self.daemon_dir / sub, ignore_errors=True)
        for sub in ("log", "pids", "ctld", "spool", "run"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        (self.daemon_dir / "run").mkdir(exist_ok=True)
        started = time.monotonic()
        layout = Layout.pick(working, spares)
        self._write_munge_key()
        self._write_conf(layout)
        munge_log = self.munge_log
        munge_log.touch()
        munge = pwd.getpwnam("munge")
        os.chown(munge_log, munge.pw_uid, munge.pw_gid)
        self._spawn("munged", [
            DAEMONS["munged"], "--foreground",
            "--force", f"--socket={self.munge_socket}",
            f"--key-file={self.munge_dir / 'munge.key'}",
            f"--pid-file={self.munge_dir / 'munged.pid'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}", f"--log-file={munge_log}"],
            user="munge")
        self._wait("munged's socket", self.munge_socket.exists, 20)
        self._start_accounting(layout)
        # -i: the state folder was emptied above; nothing to recover.
        self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-i", "-f", str(self.conf)])
        for node in layout.nodes:
            self.start_slurmd(node.name)
        names = {n.name for n in layout.nodes}
        self._wait("every node idle",
                   lambda: {k for k, v in self.node_states().items() if v == "idle"} == names,
                   60)
        log(f"slurmcluster: {len(names)} nodes idle in {time.monotonic() - started:.1f} s; "
            f"SLURM_CONF={self.conf}")
        return self.conf


    def _start_accounting(self, layout: Layout) -> None:
        """A fresh MariaDB in `<state>/db` (loopback only), slurmdbd on it, and
        this cluster registered, before slurmctld starts and reports to it."""
        data, mysql = self.daemon_dir / "db", pwd.getpwnam("mysql")
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}",
                        "--user=mysql", "--auth-root-authentication-method=socket",
                        "--skip-test-db"], check=True, capture_output=True, timeout=60)
        for path in (data, *data.rglob("*")):
            os.chown(path, mysql.pw_uid, mysql.pw_gid)
        socket_path = self.daemon_dir / "run" / "mariadb.sock"
        os.chown(socket_path.parent, mysql.pw_uid, mysql.pw_gid)
        self._spawn("mariadbd", [
            DAEMONS["mariadbd"], "--no-defaults", f"--datadir={data}",
            f"--socket={socket_path}", f"--port={layout.db_port}", "--bind-address=127.0.0.1",
            "--skip-name-resolve", f"--pid-file={socket_path.parent / 'mariadb.pid'}",
            # What slurmdbd's start-up check asks of InnoDB.
            "--innodb-buffer-pool-size=128M", "--innodb-lock-wait-timeout=900"], user="mysql")
        self._wait("MariaDB's socket", socket_path.exists, 30)
        sql = (f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
               f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';")
        subprocess.run(["mariadb", "--no-defaults", f"--socket={socket_path}", "-u", "root",
                        "-e", sql], check=True, capture_output=True, timeout=30)
        self._write_dbd_conf(layout)
        self._spawn("slurmdbd", [DAEMONS["slurmdbd"], "-D"])
        env = {**os.environ, **self.env}
        self._wait("slurmdbd to register the cluster", lambda: subprocess.run(
            ["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], env=env, timeout=15,
            capture_output=True).returncode == 0, 60)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
