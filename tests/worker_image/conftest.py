"""Fixtures for the trainer tests. No database: nothing here touches Django models."""

import pytest

from .helpers import STANDBY, ControlPlane, Launcher


@pytest.fixture(scope="session", autouse=True)
def standby():
    """The warm standby the launches go through (helpers.Standby), started
    ahead of the first so that it is ready by then, and stopped at the end."""
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
