"""Shared fixtures: the real broker, the personas every authorization test
uses (an owner, a teammate, an outsider, an operator, anonymous), and the
team's plain job."""

import os

# One intra-op thread for the torch the tests run in process: the suite runs
# on a few cores beside its own rank processes, Redis and PostgreSQL (and on
# one xdist worker per core), where torch's spinning OpenMP threads wait on
# each other: a nano model's forward took 185 ms with two threads on a loaded
# 2-core machine and 7 ms with one. Set before anything imports torch; the
# local fleet's ranks already get the same from the provider.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from accounts.models import ApiToken
from clusters.models import Cluster, Node, NodePool
from controlplane.embedded import start_redis
from jobs.models import Quota, Team
from tests.api_factories import make_job
from tests.support import memory_provider as memory

# The in-memory fleet is a test double, not a product provider: registered here.
memory.register()

# pytest-django's fixtures that open the database to a test; it refuses the
# database to any test without one of them or the django_db mark.
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences",
                               "django_db_serialized_rollback", "live_server"})


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marks
def pytest_collection_modifyitems(items):
    """Marks `database` on every test that may use the database: only these
    can come out differently on SQLite than on PostgreSQL, so .ci/run's
    SQLite pass runs them alone."""
    for item in items:
        if item.get_closest_marker("django_db") or DATABASE_FIXTURES.intersection(
                getattr(item, "fixturenames", ())):
            item.add_marker("database")


@pytest.fixture(scope="session", autouse=True)
def no_fleet_process_outlives_the_run(tmp_path_factory):
    """A net under the fixtures that stop what a test started: any local-fleet
    process of this run (a node's warm standby waits for a launch forever)
    dies when the run ends."""
    roots = (str(tmp_path_factory.getbasetemp().resolve()),
             str(settings.LOCAL_FLEET_DIR.resolve()))
    yield
    from regatta.node import procs

    left = [p for p in procs.scan() if p.env.get(procs.FLEET_TAG, "").startswith(roots)]
    procs.kill_hard(left)


@pytest.fixture(scope="session", autouse=True)
def broker():
    """A real Redis for the whole run: the embedded one in the state folder
    (`make test` gives the suite its own) unless REDIS_URL is set. The run
    starts by emptying that database, so a REDIS_URL given to the tests must
    name a database number nothing else uses (README; .ci/run uses /15)."""
    proc = start_redis(settings.EMBEDDED_REDIS_SOCKET) if settings.EMBEDDED_REDIS else None
    from controlplane.redis_client import get_redis

    get_redis().flushdb()
    yield settings.REDIS_URL
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(autouse=True)
def fresh_redis_state(broker):
    """Each test starts with no sign-ins or token creations counted, and no
    web marked as listening by an earlier test's web server (a stale mark
    reads as a web that is away, controlplane/lib/receiver.py): both live in
    Redis, which outlives a test."""
    from controlplane.lib import receiver
    from controlplane.redis_client import get_redis

    keys = [*get_redis().scan_iter(match="regatta-cache:*", count=1000),
            *get_redis().scan_iter(match="regatta-throttle:*", count=1000)]
    get_redis().delete(*keys, receiver.ALIVE_AT, receiver.SINCE)


@pytest.fixture(scope="session", autouse=True)
def fast_password_hashing():
    """Personas get real passwords; PBKDF2's deliberate slowness (~0.5 s a
    user on this machine) would otherwise dominate the suite's run time."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def static_files_looked_up_per_request():
    """WhiteNoise lists every static file as its middleware starts: once per
    process in production, but once per test client here (about 65 ms each,
    a sixth of the authorization matrix). Its autorefresh mode looks a file
    up when it is asked for instead, and serves the same files."""
    from django.test import override_settings

    with override_settings(WHITENOISE_AUTOREFRESH=True):
        yield


def _user(django_user_model, username, **extra):
    return django_user_model.objects.create_user(username, password="pw-" + username, **extra)


@pytest.fixture
def cluster(db):
    cluster = Cluster.objects.create(name="cpu-a", provider=Cluster.Provider.LOCAL)
    pool = NodePool.objects.create(cluster=cluster, name="default", gpus_per_node=2, size=4,
                                   spare_count=1)
    for i in range(5):
        Node.objects.create(cluster=cluster, pool=pool, name=f"cpu-a-{i}", gpus=2,
                            state=Node.State.READY, is_spare=(i == 4))
    return cluster


@pytest.fixture
def pool(cluster):
    return cluster.pools.get()


@pytest.fixture
def team(db, cluster):
    team = Team.objects.create(name="vision", display_name="Vision")
    Quota.objects.create(team=team, cluster=cluster, gpus=4, max_running_jobs=3)
    return team


@pytest.fixture
def job(team, cluster, owner):
    """A job the owner submitted for the team, not yet admitted."""
    return make_job(team, cluster, owner)


@pytest.fixture
def other_team(db, cluster):
    team = Team.objects.create(name="speech", display_name="Speech")
    Quota.objects.create(team=team, cluster=cluster, gpus=4)
    return team


@pytest.fixture
def owner(django_user_model, team):
    user = _user(django_user_model, "olivia")
    team.members.add(user)
    return user


@pytest.fixture
def teammate(django_user_model, team):
    user = _user(django_user_model, "tom")
    team.members.add(user)
    return user


@pytest.fixture
def outsider(django_user_model, other_team):
    user = _user(django_user_model, "oscar")
    other_team.members.add(user)
    return user


@pytest.fixture
def operator(django_user_model):
    return _user(django_user_model, "opal", is_staff=True)


@pytest.fixture
def admin_user_(django_user_model):
    return django_user_model.objects.create_superuser("ada", password="pw-ada")


def client_for(user) -> APIClient:
    """An API client that authenticates with a real API token of `user`."""
    client = APIClient()
    if user is not None:
        _, raw = ApiToken.issue(user, "test")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def api():
    return client_for


@pytest.fixture
def fleet_dirs(settings, tmp_path):
    """Checkpoints, artifacts and the in-memory fleet private to one test."""
    settings.CHECKPOINT_ROOT = tmp_path / "checkpoints"
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    memory.reset()
    yield tmp_path
    memory.reset()
