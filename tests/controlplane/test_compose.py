"""docker-compose.yml, the production-shaped stack: nothing that serves or
runs tasks starts before the schema is migrated."""

from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def services():
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_it_has_a_one_shot_migrate_service(services):
    migrate = services["migrate"]
    assert migrate["command"][-2:] == ["migrate", "--noinput"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", ["web", "worker", "beat"])
def test_it_starts_web_worker_and_beat_only_after_migrate_succeeded(services, name):
    assert services[name]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }


def test_every_long_running_service_restarts_when_it_exits(services):
    long_running = {name for name in services if name != "migrate"}
    assert long_running == {"postgres", "redis", "web", "worker", "beat"}
    for name in long_running:
        assert services[name].get("restart") in ("always", "unless-stopped"), name
