"""Builds the cluster's binaries from the Go modules pinned in go/*/go.mod.

The versions live in those go.mod files only; the cache folder's name is
derived from them (and from the Go toolchain and a hash of the module
files), so a change of pin builds anew and an unchanged one is reused.
Binaries are kept outside the clone, under $XDG_CACHE_HOME/regatta-kube.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KUBE_MOD = HERE / "go" / "kube"
OPERATOR_MOD = HERE / "go" / "trainingoperator"
TRAINER_MOD = HERE / "go" / "trainer"
MODULES = (KUBE_MOD, OPERATOR_MOD, TRAINER_MOD)
ENABLE_HINT = ("install Go >= 1.26 (https://go.dev/dl/) and run `make kube-build` to enable "
               "the real-cluster tests")


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Component:
    name: str
    module_dir: Path
    package: str
    # Stamped into the binary the way the release's own build does, so the
    # API server reports v1.x.y and clients that check it are satisfied.
    version_ldflags: bool = False
    # Source edits applied with `go build -overlay` (see Edit), none for most.
    edits: tuple[Edit, ...] = ()


@dataclass(frozen=True)
class Edit:
    """One literal replaced in a main package of a dependency, at build time.

    The module cache is read-only to the go command (an overlay may not
    replace files under GOMODCACHE), so the package's files are laid over a
    folder of this module that does not exist on disk, `_edited/<name>`,
    with `go build -overlay`, and built from there against this module's
    requirements: nothing is written into the module cache or the clone.
    The build fails if the text is not found exactly once, so a new pin that
    moved the code shows here instead of in a cluster that does not start."""
    module: str
    package_dir: str
    file: str
    old: str
    new: str
    why: str


KUEUE_METRICS_CERTS = Edit(
    "sigs.k8s.io/kueue", "cmd/kueue", "main.go",
    'metricsCertPath := "/etc/kueue/metrics/certs"',
    'metricsCertPath := os.Getenv("REGATTA_KUEUE_METRICS_CERT_DIR")',
    "the metrics certificate folder from the environment, not /etc/kueue/metrics/certs")


COMPONENTS = (
    Component("etcd", KUBE_MOD, "./etcd"),
    Component("kube-apiserver", KUBE_MOD, "k8s.io/kubernetes/cmd/kube-apiserver", True),
    Component("kube-scheduler", KUBE_MOD, "k8s.io/kubernetes/cmd/kube-scheduler", True),
    Component("kube-controller-manager", KUBE_MOD,
              "k8s.io/kubernetes/cmd/kube-controller-manager", True),
    Component("kwok", KUBE_MOD, "sigs.k8s.io/kwok/cmd/kwok"),
    Component("training-operator", OPERATOR_MOD,
              "github.com/kubeflow/training-operator/cmd/training-operator.v1"),
    Component("jobset", TRAINER_MOD, "sigs.k8s.io/jobset"),
    Component("trainer-controller-manager", TRAINER_MOD,
              "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"),
    Component("kueue", TRAINER_MOD, "sigs.k8s.io/kueue/cmd/kueue",
              edits=(KUEUE_METRICS_CERTS,)),
)


def go_binary() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    # The official tarball's place, which a non-login shell's PATH may lack.
    return "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None


def _required(mod: Path, module: str) -> str:
    text = (mod / "go.mod").read_text()
    match = re.search(rf"^(?:require)?\s+{re.escape(module)} (v\S+)", text, re.M)
    if not match:
        raise BuildError(f"{mod}/go.mod does not require {module}")
    return match.group(1)


def versions() -> dict[str, str]:
    """The pinned versions, read from the go.mod files."""
    return {
        "kubernetes": _required(KUBE_MOD, "k8s.io/kubernetes"),
        "etcd": _required(KUBE_MOD, "go.etcd.io/etcd/server/v3"),
        "kwok": _required(KUBE_MOD, "sigs.k8s.io/kwok"),
        "training-operator": _required(OPERATOR_MOD, "github.com/kubeflow/training-operator"),
        "trainer": _required(TRAINER_MOD, "github.com/kubeflow/trainer/v2"),
        "jobset": _required(TRAINER_MOD, "sigs.k8s.io/jobset"),
        "kueue": _required(TRAINER_MOD, "sigs.k8s.io/kueue"),
    }


def _go_version(go: str) -> str:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "regatta-kube"


def bin_dir(go: str | None = None) -> Path:
    go = go or go_binary()
    if go is None:
        raise BuildError("go is not installed: " + ENABLE_HINT)
    digest = hashlib.sha256()
    for mod in MODULES:
        for name in sorted(os.listdir(mod)):
            path = mod / name
            if path.is_file():
                digest.update(name.encode() + b"\0" + path.read_bytes())
        if (mod / "etcd" / "main.go").exists():
            digest.update((mod / "etcd" / "main.go").read_bytes())
    for comp in COMPONENTS:
        digest.update(repr(comp.edits).encode())
    v = versions()
    key = (f"k8s-{v['kubernetes']}_etcd-{v['etcd']}_kwok-{v['kwok']}"
           f"_training-operator-{v['training-operator']}_trainer-{v['trainer']}"
           f"_jobset-{v['jobset']}_kueue-{v['kueue']}_{_go_version(go)}"
           f"_{digest.hexdigest()[:10]}")
    return cache_root() / key / "bin"


def binaries_present(folder: Path) -> bool:
    return all((folder / c.name).is_file() for c in COMPONENTS)


def module_dir(mod: Path, module: str, go: str | None = None) -> Path:
    """Where the module cache holds a dependency's source (its CRDs, stages)."""
    go = go or go_binary()
    out = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", module], cwd=mod,
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        subprocess.run([go, "mod", "download", module], cwd=mod, check=True)
        out = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", module], cwd=mod,
                             capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def build_log(folder: Path | None = None) -> Path:
    """Where a background build writes (beside its binaries)."""
    return (folder or bin_dir()).parent / "build.log"


def _lock_file(folder: Path) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder.parent / "build.lock"


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One builder per set of versions at a time: a second `build` (a test
    run beside a `make kube-build`) waits, then finds the binaries made."""
    with open(_lock_file(folder), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def building_now(folder: Path | None = None) -> bool:
    """Whether some process is building these binaries at this moment."""
    folder = folder or bin_dir()
    with open(_lock_file(folder), "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def wait_while_building(timeout: float, folder: Path | None = None) -> None:
    """Returns once no build runs (finished, failed or never started)."""
    deadline = time.monotonic() + timeout
    while building_now(folder) and time.monotonic() < deadline:
        time.sleep(2)


def start_in_background() -> str:
    """Starts `build` in a process of its own, unless the binaries are there
    or a build already runs, and returns what it did. `make test` calls it so
    that a cold build (tens of minutes) overlaps the rest of the suite, whose
    real-cluster tests run last and wait for it."""
    out = bin_dir()
    if binaries_present(out):
        return f"testcluster: binaries in {out}"
    if building_now(out):
        return f"testcluster: a build is already running; log {build_log(out)}"
    log = open(build_log(out), "w")
    proc = subprocess.Popen([sys.executable, "-m", "testcluster", "build"], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=HERE.parent, start_new_session=True)
    log.close()
    # Returns only once the child holds the lock, so that whoever looks next
    # (the suite's first real-cluster test) sees a build running.
    deadline = time.monotonic() + 60
    while not building_now(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return (f"testcluster: building the test cluster in the background (pid {proc.pid}); "
            f"log {build_log(out)}")


def build(log=print, nice: int = 15) -> Path:
    """Builds what is missing, one binary at a time, and returns the folder.

    `nice` keeps a cold build (tens of minutes of compiling on two cores)
    from starving whatever else the machine runs."""
    go = go_binary()
    if go is None:
        raise BuildError("go is not installed: " + ENABLE_HINT)
    out = bin_dir(go)
    if binaries_present(out):
        return out
    with _build_lock(out):
        return _build_missing(go, out, log, nice)


def _build_missing(go: str, out: Path, log, nice: int) -> Path:
    if binaries_present(out):
        return out  # another builder finished while this one waited
    out.mkdir(parents=True, exist_ok=True)
    kube = versions()["kubernetes"]
    major, minor = kube.lstrip("v").split(".")[:2]
    stamp = " ".join(f"-X {pkg}.{k}={v}" for pkg in ("k8s.io/component-base/version",
                                                     "k8s.io/client-go/pkg/version")
                     for k, v in (("gitVersion", kube), ("gitMajor", major),
                                  ("gitMinor", minor)))
    total = time.monotonic()
    for comp in COMPONENTS:
        target = out / comp.name
        if target.is_file():
            continue
        ldflags = "-s -w" + (" " + stamp if comp.version_ldflags else "")
        tmp = out / f".{comp.name}.tmp"
        overlay, package = _overlay(go, comp, out)
        # `-w` drops the debug information at the link only; the compiler
        # still writes it for every package unless told not to, about a
        # tenth of the compile's CPU (etcd: 93 against 106 CPU-s).
        cmd = ["nice", "-n", str(nice), go, "build", "-trimpath", "-gcflags=all=-dwarf=false",
               f"-ldflags={ldflags}", *([f"-overlay={overlay}"] if overlay else []),
               "-o", str(tmp), package]
        log(f"testcluster: building {comp.name} ({comp.package})")
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=comp.module_dir, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"building {comp.name} failed:\n{done.stderr[-4000:]}")
        tmp.rename(target)
        log(f"testcluster: built {comp.name} in {time.monotonic() - started:.0f} s")
    log(f"testcluster: all binaries in {out} ({time.monotonic() - total:.0f} s)")
    return out


def _overlay(go: str, comp: Component, out: Path) -> tuple[Path | None, str]:
    """For a component with edits: writes its package's files, edited, and
    the overlay that lays them over `_edited/<name>` in its module; returns
    the overlay and the package to build."""
    if not comp.edits:
        return None, comp.package
    (edit,) = comp.edits  # one package, one edit so far
    source = module_dir(comp.module_dir, edit.module, go) / edit.package_dir
    folder = out.parent / "edited" / comp.name
    folder.mkdir(parents=True, exist_ok=True)
    replace = {}
    for original in sorted(source.glob("*.go")):
        if original.name.endswith("_test.go"):
            continue
        text = original.read_text()
        if original.name == edit.file:
            if text.count(edit.old) != 1:
                raise BuildError(f"{comp.name}: {edit.package_dir}/{edit.file} of {edit.module} "
                                 f"has {text.count(edit.old)} copies of {edit.old!r}, not one: "
                                 f"the edit ({edit.why}) needs a look at the new version")
            text = text.replace(edit.old, edit.new)
        copy = folder / original.name
        copy.write_text(text)
        replace[str(comp.module_dir / "_edited" / comp.name / original.name)] = str(copy)
    overlay = folder.parent / f"{comp.name}.overlay.json"
    overlay.write_text(json.dumps({"Replace": replace}))
    return overlay, f"./_edited/{comp.name}"


if __name__ == "__main__":
    try:
        print(build())
    except BuildError as exc:
        sys.exit(str(exc))
