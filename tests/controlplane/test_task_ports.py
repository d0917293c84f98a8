"""The kernel's task ports: controlplane/lib names no app, even by string,
and the apps provide every port when Django starts."""

import ast
from pathlib import Path

import pytest

from controlplane.lib import tasks as ports

APPS = ("accounts", "clusters", "jobs", "checkpoints", "notifications", "frontend", "cli")
KERNEL = Path(ports.__file__).parent


def _strings(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


@pytest.mark.parametrize("path", sorted(KERNEL.glob("*.py")), ids=lambda p: p.name)
def test_the_kernel_names_no_app_module_even_by_string(path):
    found = [(line, text) for line, text in _strings(path)
             if any(text == app or text.startswith(f"{app}.") for app in APPS)]
    assert not found, f"{path.name} names an app's module: {found}"


@pytest.mark.parametrize("port", [ports.RECONCILE_JOB, ports.RECONCILE_JOBS,
                                  ports.ADMIT_CLUSTER, ports.RECONCILE_CLUSTER],
                         ids=repr)
def test_every_port_is_provided_by_an_app_at_start(port):
    assert port.resolve().name.split(".")[0] in APPS


def test_a_port_no_app_provides_says_which_task_is_missing():
    with pytest.raises(LookupError, match="reconcile a widget"):
        ports.Port("reconcile a widget").resolve()


def test_a_port_refuses_a_second_different_task():
    port = ports.Port("reconcile a job, again")
    port.provide(ports.RECONCILE_JOB.resolve())
    port.provide(ports.RECONCILE_JOB.resolve())  # the same one twice is fine
    with pytest.raises(RuntimeError, match="provided twice"):
        port.provide(ports.RECONCILE_CLUSTER.resolve())
