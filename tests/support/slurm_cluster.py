"""A real Slurm for the suite (slurmcluster/), once per test session, in the
suite's state folder on free loopback ports.

`slurm` starts munged, the accounting (MariaDB, slurmdbd), slurmctld and six
slurmds: n1-n4 in partition `gpu`, n5-n6 in partition `spare`, two fake GPUs
each. `slurm_world` hands a test
the session's Slurm with every node up and resumed, and no job or
reservation left, after it, whatever the test did to them.

Loaded as a plugin (pyproject's addopts). Where Slurm's packages are missing
(or the suite is not root), the tests that use it are left out with one line
saying how to enable them, unless CI=true: CI must never skip them, so there
they fail.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from slurmcluster.cluster import SlurmCluster, why_unavailable
from tests.support.waiting import eventually


@dataclass
class SlurmWorld:
    cluster: SlurmCluster

    @property
    def conf(self) -> str:
        return str(self.cluster.conf)

    def run(self, *argv: str) -> str:
        return subprocess.run(list(argv), env={**os.environ, **self.cluster.env}, check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def node(self, name: str) -> dict:
        from clusters.providers.slurm.commands import record

        return record(self.run("scontrol", "show", "node", "-o", name).strip())

    def job(self, job_id: str) -> dict:
        from clusters.providers.slurm.commands import record

        return record(self.run("scontrol", "show", "job", "-o", str(job_id)).strip())

    def lose_node(self, name: str) -> list[int]:
        return self.cluster.lose_node(name)

    def job_processes(self, job_id: str) -> list[int]:
        return self.cluster.job_processes(str(job_id))

    def reservations(self) -> dict[str, dict]:
        from clusters.providers.slurm.commands import record

        out = self.run("scontrol", "show", "reservation", "-o")
        found = [record(line) for line in out.splitlines() if line.startswith("ReservationName=")]
        return {r["ReservationName"]: r for r in found}

    def _answers(self) -> bool:
        try:
            return bool(self.cluster.node_states())
        except subprocess.CalledProcessError:
            return False

    def restore(self) -> None:
        """Every node back (slurmd running, resumed), no job and no
        reservation left."""
        if "slurmctld" not in self.cluster.running():
            self.cluster.start_slurmctld()  # a test that restarts it failed half-way
            eventually(self._answers, timeout=30, interval=0.5, what="slurmctld to answer again")
        self.cluster.cancel_jobs()
        for name in self.reservations():
            self.run("scontrol", "delete", f"ReservationName={name}")
        running = self.cluster.running()
        for node in self.cluster.layout().nodes:
            if f"slurmd-{node.name}" not in running:
                self.cluster.start_slurmd(node.name)
        names = {n.name for n in self.cluster.layout().nodes}

        def all_idle():
            states = self.cluster.node_states()
            for name, state in states.items():
                if state != "idle":
                    subprocess.run(["scontrol", "update", f"nodename={name}", "state=resume"],
                                   env={**os.environ, **self.cluster.env},
                                   capture_output=True, timeout=30)
            return {k for k, v in states.items() if v == "idle"} == names

        eventually(all_idle, timeout=60, interval=0.5, what="every Slurm node idle again")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _uses_slurm(item) -> bool:
    return "slurm" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    reason = why_unavailable()
    if reason is None or _in_ci():
        return
    left_out = [item for item in items if _uses_slurm(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
        config._slurm_left_out = (len(left_out), reason)


def pytest_terminal_summary(terminalreporter, config):
    left_out = getattr(config, "_slurm_left_out", None)
    if left_out:
        count, reason = left_out
        terminalreporter.write_line(f"{count} real-Slurm tests skipped: {reason}", yellow=True)


@pytest.fixture(scope="session")
def slurm():
    reason = why_unavailable()
    if reason is not None:
        pytest.fail(f"CI must run the real-Slurm tests: {reason}", pytrace=False)
    cluster = SlurmCluster(Path(settings.STATE_DIR) / "slurm")
    cluster.up(log=lambda line: None)
    try:
        yield SlurmWorld(cluster)
    finally:
        cluster.down()


@pytest.fixture
def slurm_world(slurm):
    """The session's Slurm; after the test, every node up and idle, no job."""
    yield slurm
    slurm.restore()
