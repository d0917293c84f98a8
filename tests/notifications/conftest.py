import ipaddress

import pytest

from tests.notifications.receiver import Receiver


@pytest.fixture
def loopback_allowed(settings):
    """What an operator sets to deliver to a receiver on this machine:
    REGATTA_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8."""
    settings.WEBHOOK_ALLOWED_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def make_receiver():
    servers = []

    def make(**kw) -> Receiver:
        servers.append(Receiver(**kw))
        return servers[-1]

    yield make
    for server in servers:
        server.close()
