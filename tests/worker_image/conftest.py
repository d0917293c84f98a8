"""Fixtures for the trainer tests. No database: nothing here touches Django models."""

import pytest

from .helpers import ControlPlane, Launcher


@pytest.fixture
def launcher(tmp_path):
    launch = Launcher(tmp_path / "runs")
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
