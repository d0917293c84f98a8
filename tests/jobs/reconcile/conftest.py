import pytest

from tests.fleet_helpers import team_with_quota


@pytest.fixture
def mem_team(mem_cluster):
    """A team with a quota on the module's in-memory cluster (`mem_cluster`)."""
    return team_with_quota(mem_cluster)
