"""Running Slurm's own commands and reading their answers.

The CLI rather than slurmrestd (docs/slurm.md): `scontrol`, `sbatch`,
`squeue` and `scancel` keep their text formats across releases, are on every
Slurm login node, and drain a node, which the REST API of 22.05 cannot.
`scontrol show ... -o` prints one record per line as `Key=value` pairs whose
values may hold spaces (`Reason=Not responding [slurm@...]`); `record` splits
them at the next key.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence

from controlplane.lib.errors import PermanentError, TemporaryError

COMMAND_TIMEOUT_S = 30.0
# What slurmctld being away (restarting, failing over, overloaded) looks like
# to a client: worth a retry after a delay, unlike a rejected request.
_CONTROLLER_AWAY = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Zero Bytes were transmitted|Communication connection failure|"
    r"Slurm backup controller in standby mode", re.IGNORECASE)
_KEY = re.compile(r"(?<!\S)([A-Za-z][\w:/.]*)=")


class SlurmCommandError(RuntimeError):
    """A Slurm command said no in a way that is neither the controller
    being away nor a setting: retried with backoff (the third error class)."""


class Slurm:
    """Slurm's commands, run with the cluster's slurm.conf (none: the
    machine's own, /etc/slurm/slurm.conf)."""

    def __init__(self, slurm_conf: str = "", env: dict | None = None):
        self.env = dict(os.environ if env is None else env)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf

    def run(self, argv: Sequence[str], env: dict | None = None, ok_codes=(0,)) -> str:
        env = self.env if env is None else {**env, **_conf_of(self.env)}
        try:
            done = subprocess.run(list(argv), env=env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except FileNotFoundError as exc:
            raise PermanentError(f"{argv[0]} is not installed here: the control plane needs "
                                 "Slurm's client commands (docs/slurm.md)") from exc
        except subprocess.TimeoutExpired as exc:
            raise TemporaryError(f"{argv[0]} took over {COMMAND_TIMEOUT_S:g} s",
                                 delay=10.0) from exc
        if done.returncode in ok_codes:
            return done.stdout
        said = (done.stderr or done.stdout).strip()
        if _CONTROLLER_AWAY.search(said):
            raise TemporaryError(f"slurmctld is away: {' '.join(argv[:2])}: {said}", delay=10.0)
        raise SlurmCommandError(f"{' '.join(argv[:3])} exited {done.returncode}: {said}")

    def show(self, kind: str, name: str = "") -> list[dict[str, str]]:
        """`scontrol show <kind> [name] -o` as records; [] when `name` is
        unknown (a job past MinJobAge, a node removed from the config)."""
        argv = ["scontrol", "show", kind, "-o", *([name] if name else [])]
        try:
            out = self.run(argv)
        except SlurmCommandError as exc:
            if "Invalid" in str(exc) or "not found" in str(exc):
                return []
            raise
        return [record(line) for line in out.splitlines()
                if line.strip() and not line.startswith("No ")]


    def accounted(self, job_id: str) -> dict[str, str]:
        """The accounting's record of a job (`sacct`, through slurmdbd) in
        `scontrol show job`'s keys: JobState, ExitCode, NodeList, Reason.
        {} where the cluster keeps no accounting, or it has no such job."""
        try:
            out = self.run(["sacct", "-j", str(job_id), "-X", "-n", "-P",
                            "-o", "JobID,State,ExitCode,NodeList,Reason"])
        except SlurmCommandError:
            return {}  # "Slurm accounting storage is disabled", or slurmdbd away
        for line in out.splitlines():
            fields = line.split("|")
            if len(fields) == 5 and fields[0] == str(job_id):
                # "CANCELLED by 0": the state is its first word, as scontrol says it.
                return {"JobId": fields[0], "JobState": fields[1].split()[0] if fields[1] else "",
                        "ExitCode": fields[2], "NodeList": fields[3], "Reason": fields[4]}
        return {}


def _conf_of(env: dict) -> dict:
    return {k: env[k] for k in ("SLURM_CONF",) if k in env}


def record(line: str) -> dict[str, str]:
    """One `scontrol show -o` line as a dict."""
    found = list(_KEY.finditer(line))
    result = {}
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        result[match.group(1)] = line[match.end():end].strip()
    return result
