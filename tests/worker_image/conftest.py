"""Fixtures for the trainer tests. No database: nothing here touches Django models."""

from pathlib import Path

import pytest

from .helpers import STANDBY, ControlPlane, Launcher


@pytest.fixture(scope="session", autouse=True)
def standby(request):
    """The warm standby the launches go through (helpers.Standby), stopped
    at the end. Started ahead when the session holds tests that launch
    (the slow ones here), so that it is ready by the first: the fast ones
    (`make test-fast`) pay for none."""
    here = Path(__file__).parent
    if any(item.path.is_relative_to(here) and item.get_closest_marker("slow")
           for item in request.session.items):
        STANDBY.start()
    try:
        yield STANDBY
    finally:
        STANDBY.stop()


@pytest.fixture
def launcher(tmp_path):
    launch = Launcher(tmp_path / "runs")
    try:
        yield launch
    finally:
        launch.cleanup()


@pytest.fixture
def cold_launcher(tmp_path):
    """Each launch a torchrun process of its own, as on Kubernetes and Slurm."""
    launch = Launcher(tmp_path / "runs", warm=False)
    try:
        yield launch
    finally:
        launch.cleanup()


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory):
    launch = Launcher(tmp_path_factory.mktemp("runs"))
    try:
        yield launch
    finally:
        launch.cleanup()


@pytest.fixture
def control_plane():
    plane = ControlPlane()
    try:
        yield plane
    finally:
        plane.close()
