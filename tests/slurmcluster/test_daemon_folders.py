"""The one-machine Slurm starts when the state folder is private to root (a
`mktemp -d`, mode 0700): munged and MariaDB, which run as the munge and
mysql users, get their folders where they can reach them, and a folder in
their way that someone else made is refused with a message saying what to
do. The real start uses the `slurm` fixture so that it runs where the
suite's other real-Slurm tests run (and fails in CI where they would)."""

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurmcluster.cluster import DAEMON_PARENT, SlurmCluster, SlurmClusterError, passes_into


@pytest.fixture
def private_state():
    folder = Path(tempfile.mkdtemp(prefix="regatta-private-"))  # mode 0700, root's
    yield folder / "slurm"
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def squatters_folder(state: Path) -> Path:
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:12]
    return DAEMON_PARENT / f"regatta-slurm-{digest}"


def test_the_daemons_folders_leave_a_state_folder_their_users_cannot_enter(private_state):
    assert oct(private_state.parent.stat().st_mode & 0o777) == "0o700"
    assert not passes_into(private_state, "munge")
    cluster = SlurmCluster(private_state)
    assert cluster.daemon_dir.parent == DAEMON_PARENT
    assert passes_into(cluster.daemon_dir, "munge") and passes_into(cluster.daemon_dir, "mysql")
    assert cluster.munge_socket.is_relative_to(cluster.daemon_dir)
    # A state folder they can pass into keeps them, as before.
    private_state.parent.chmod(0o711)
    assert SlurmCluster(private_state).daemon_dir == private_state.resolve()


def test_a_folder_someone_else_made_in_the_way_is_refused_saying_what_to_do(private_state):
    squatted = squatters_folder(private_state)
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    try:
        with pytest.raises(SlurmClusterError, match="remove it"):
            SlurmCluster(private_state).up(working=1, spares=0, log=lambda line: None)
    finally:
        squatted.rmdir()


def test_slurm_starts_and_keeps_accounts_in_a_private_state_folder(slurm, private_state):
    cluster = SlurmCluster(private_state)
    try:
        cluster.up(working=1, spares=0, log=lambda line: None)
        assert cluster.node_states() == {"n1": "idle"}
        env = {**os.environ, **cluster.env}
        job = subprocess.run(["sbatch", "--parsable", "--wrap", "true"], env=env,
                             capture_output=True, text=True, timeout=30, check=True)
        assert job.stdout.strip().isdigit()
        sacct = subprocess.run(["sacct", "-n", "-X", "-o", "JobID"], env=env,
                               capture_output=True, text=True, timeout=30)
        assert sacct.returncode == 0, sacct.stderr
        daemons = cluster.daemon_dir
        assert daemons != private_state.resolve() and (daemons / "munge" / "munge.key").exists()
    finally:
        cluster.down()
    assert not daemons.exists()  # it goes with the daemons
