"""Fixtures the job tests share beyond tests/conftest.py."""

import pytest

from tests.api_factories import make_job


@pytest.fixture
def reporting_job(team, cluster, owner):
    """A running job whose ranks report to the worker API. Workers may report
    only checkpoints under the job's own storage: /tmp/ckpt."""
    return make_job(team, cluster, owner, phase="running", storage_uri="/tmp/ckpt")
