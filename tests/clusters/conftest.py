import pytest


@pytest.fixture
def fsx(tmp_path):
    """Where the shared file system (FSx for Lustre through the cluster's
    PVC) is mounted, in the ranks and here."""
    path = tmp_path / "fsx"
    path.mkdir()
    return path
