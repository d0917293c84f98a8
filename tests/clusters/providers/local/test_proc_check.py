"""The local fleet finds, stops and kills its ranks by the tags in
/proc/<pid>/environ and tells a reused pid by /proc/<pid>/stat
(regatta/node/procs.py). On a system whose /proc lacks them
(a sandbox's kernel, gVisor's say) a launch would start ranks that no stop,
drain or kill could ever find: it is refused, saying why. The short /proc
below is a folder standing in for such a system's (this machine's is whole)."""

import os
import shutil

import pytest
from regatta.node import procs

from clusters.providers.local import LocalProvider
from controlplane.lib.errors import PermanentError
from tests.support.local_fleet import make_pool, request


@pytest.fixture
def proc_root(monkeypatch, tmp_path):
    root = tmp_path / "proc"
    monkeypatch.setattr(procs, "PROC", str(root))
    procs.unreadable.cache_clear()
    yield root
    procs.unreadable.cache_clear()


def test_this_machines_proc_shows_the_fleet_its_processes():
    procs.unreadable.cache_clear()
    assert procs.unreadable() == ""


def test_a_launch_on_a_proc_without_environ_is_refused_saying_why(proc_root, tmp_path):
    me = proc_root / str(os.getpid())
    me.mkdir(parents=True)
    shutil.copy(f"/proc/{os.getpid()}/stat", me / "stat")  # stat there, environ not
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab")
    pool = make_pool(size=1, spare_count=0)

    with pytest.raises(PermanentError, match=r"/proc/<pid>/environ cannot be read"):
        provider.launch(request(provider, pool, "refused", nodes=1))
    assert not (provider.root / "attempts" / "refused" / "ref.json").exists()


def test_a_proc_whose_environ_shows_nothing_is_named_too(proc_root):
    me = proc_root / str(os.getpid())
    me.mkdir(parents=True)
    (me / "environ").write_bytes(b"")
    assert procs.unreadable() == f"{proc_root}/<pid>/environ shows no environment"
