"""No part of a job's program can be read as one of torchrun's own options,
on any launcher: the local fleet's, Slurm's node script, the Kubernetes
PyTorchJob's and TrainJob's container command. Each argv is read back by
torchrun's own parser (torch.distributed.run), as the node would read it.
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from torch.distributed import run as torchrun

from clusters.providers.base import LaunchRequest, Placement
from clusters.providers.kubernetes import KubeSettings
from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes import trainjob as tj
from clusters.providers.local.attempts import torchrun_argv
from clusters.providers.slurm.batch import node_script
from tests.clusters.providers.kubernetes.test_manifests import make_pool, make_request

# What a team put in `entrypoint` (and `args`) to take over torchrun: more
# processes than GPUs, another job's rendezvous, restarts, a shell.
HOSTILE = [
    ("--nproc_per_node=8", "train.py"),
    ("--master_addr=10.9.9.9", "--master_port=1", "train.py"),
    ("--rdzv_endpoint=evil:29400", "--rdzv_backend=c10d", "train.py"),
    ("--max-restarts=100", "train.py"),
    ("--no-python", "/bin/sh", "-c", "id"),
    ("-m", "--nproc_per_node=8"),
    ("train.py", "--nproc_per_node=8", "--", "--master_port=1"),
]


def read_as_torchrun(args: list[str]):
    return torchrun.parse_args(args)


def assert_only_the_program(parsed, command):
    """torchrun runs exactly `command`: its first word the program (a module
    after `-m`, the control plane's own form), the rest the program's
    arguments, none of them one of torchrun's options."""
    module = command[0] == "-m"
    assert not parsed.no_python and parsed.module == module
    assert parsed.rdzv_endpoint == "" and parsed.rdzv_backend == "static"
    program = list(command[1:] if module else command)
    assert [parsed.training_script, *parsed.training_script_args] == program


@pytest.mark.parametrize("command", HOSTILE)
def test_the_local_launch_gives_the_whole_command_to_the_program(command):
    argv = torchrun_argv("python", 2, 1, 1, 29500, command, master_addr="10.0.0.1")
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    parsed = read_as_torchrun(argv[3:])
    assert parsed.master_addr == "10.0.0.1" and parsed.master_port == 29500
    assert parsed.max_restarts == 0 and parsed.nnodes == "2" and parsed.node_rank == 1
    assert parsed.nproc_per_node == "1"
    assert_only_the_program(parsed, command)


def test_the_built_in_trainer_runs_as_a_module():
    parsed = read_as_torchrun(torchrun_argv("python", 1, 0, 1, 29500, ())[3:])
    assert parsed.module and parsed.training_script == "trainer"
    assert parsed.training_script_args == []


def _slurm_request(command) -> LaunchRequest:
    return LaunchRequest(
        job_id=1, attempt_id=1, attempt_number=1, name="job-1-a1", pool=make_pool(),
        placements=(Placement(node="n1", node_rank=0), Placement(node="n2", node_rank=1)),
        nproc_per_node=1, image="slurm", command=tuple(command), env={})


@pytest.mark.parametrize("command", HOSTILE)
def test_the_slurm_node_script_gives_the_whole_command_to_the_program(tmp_path, command):
    """The node script run by bash as srun runs it, with a stand-in for the
    worker's Python that writes down the argv it was given."""
    seen = tmp_path / "argv"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {seen}\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "node.sh"
    script.write_text(node_script(str(tmp_path), str(python), _slurm_request(command)))
    env = {**os.environ, "SLURMD_NODENAME": "n2", "MASTER_ADDR": "10.0.0.7",
           "MASTER_PORT": "29511"}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    argv = seen.read_bytes().decode().split("\0")[:-1]
    launched = argv[argv.index("--") + 1:]  # the launcher's own options end here
    assert launched[:3] == [str(python), "-m", "torch.distributed.run"]
    parsed = read_as_torchrun(launched[3:])
    assert parsed.node_rank == 1 and parsed.master_addr == "10.0.0.7"
    assert parsed.master_port == 29511 and parsed.nnodes == "2"
    assert parsed.nproc_per_node == "1" and parsed.max_restarts == 0
    assert_only_the_program(parsed, command)


def _kube_command(command, job_api: str) -> list[str]:
    request = make_request(command=tuple(command))
    if job_api == "trainjob":
        settings = KubeSettings.parse({"job_api": "trainjob", "preflight": False})
        return tj.train_job(request, settings)["spec"]["trainer"]["command"]
    job = mf.to_dict(mf.pytorch_job(request, KubeSettings()))
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "command"]


@pytest.mark.parametrize("job_api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("command", HOSTILE)
def test_the_kubernetes_container_gives_the_whole_command_to_the_program(command, job_api):
    """The operator passes the rendezvous as PET_* variables, which torchrun
    reads as its options' defaults; the command line must not override them."""
    argv = _kube_command(command, job_api)
    assert argv[0] == "torchrun"
    parsed = read_as_torchrun(argv[1:])
    # Defaults all: the operator's PET_NPROC_PER_NODE, PET_MASTER_ADDR, … stand.
    assert parsed.nproc_per_node == "1" and parsed.master_addr == "127.0.0.1"
    assert parsed.max_restarts == 0
    assert_only_the_program(parsed, command)
