import pytest

from tests.api_factories import make_attempt


@pytest.fixture
def attempt(reporting_job):
    """The reporting job's running attempt and its worker token."""
    return make_attempt(reporting_job)
