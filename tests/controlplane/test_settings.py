"""Settings come from the environment through typed helpers that name the
variable when a value is bad."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.env import (
    ImproperlyConfiguredEnv,
    env_bool,
    env_choice,
    env_float,
    env_host_port,
    env_int,
    env_list,
    env_url,
    reachable_url,
)

ROOT = Path(__file__).resolve().parents[2]


def test_it_reads_typed_values(monkeypatch):
    monkeypatch.setenv("REGATTA_X_INT", "42")
    monkeypatch.setenv("REGATTA_X_BOOL", "yes")
    monkeypatch.setenv("REGATTA_X_FLOAT", "2.5")
    monkeypatch.setenv("REGATTA_X_LIST", "a, b,,c")
    assert env_int("REGATTA_X_INT", 1) == 42
    assert env_bool("REGATTA_X_BOOL", False) is True
    assert env_float("REGATTA_X_FLOAT", 0.0) == 2.5
    assert env_list("REGATTA_X_LIST", []) == ["a", "b", "c"]


def test_it_uses_the_default_when_unset_or_blank(monkeypatch):
    monkeypatch.delenv("REGATTA_X_INT", raising=False)
    assert env_int("REGATTA_X_INT", 7) == 7
    monkeypatch.setenv("REGATTA_X_INT", "  ")
    assert env_int("REGATTA_X_INT", 7) == 7


@pytest.mark.parametrize(
    "reader, value, fragment",
    [
        (lambda: env_int("REGATTA_X", 1), "two", "REGATTA_X must be an integer"),
        (lambda: env_int("REGATTA_X", 1, minimum=1), "0", "REGATTA_X must be at least 1"),
        (lambda: env_bool("REGATTA_X", False), "maybe", "REGATTA_X must be one of"),
        (lambda: env_float("REGATTA_X", 1.0), "fast", "REGATTA_X must be a number"),
        (
            lambda: env_url("REGATTA_X", None, schemes=("redis",)),
            "http://x",
            "REGATTA_X must start",
        ),
        (lambda: env_choice("REGATTA_X", "B", choices=("A", "B")), "C",
         "REGATTA_X must be one of A, B, got 'C'"),
        (lambda: env_host_port("REGATTA_X", "h:1"), "8000", "REGATTA_X must be host:port"),
        (lambda: env_host_port("REGATTA_X", "h:1"), ":8000", "REGATTA_X must be host:port"),
        (lambda: env_host_port("REGATTA_X", "h:1"), "host:http", "REGATTA_X must end in a port"),
        (lambda: env_host_port("REGATTA_X", "h:1"), "host:70000",
         "REGATTA_X must end in a port"),
        (lambda: env_host_port("REGATTA_X", "h:1"), "::1:8000", "REGATTA_X must put an IPv6"),
        (lambda: env_host_port("REGATTA_X", "h:1"), "[::1:8000", "REGATTA_X has a malformed"),
    ],
)
def test_it_names_the_variable_of_a_bad_value(monkeypatch, reader, value, fragment):
    monkeypatch.setenv("REGATTA_X", value)
    with pytest.raises(ImproperlyConfiguredEnv, match=fragment):
        reader()


@pytest.mark.parametrize(("value", "expected"), [
    ("0.0.0.0:8000", "0.0.0.0:8000"), ("localhost:80", "localhost:80"),
    ("[::1]:8000", "[::1]:8000"),
])
def test_it_reads_a_host_and_port(monkeypatch, value, expected):
    monkeypatch.setenv("REGATTA_X", value)
    assert env_host_port("REGATTA_X", "127.0.0.1:8000") == expected


@pytest.mark.parametrize(("bind", "url"), [
    ("127.0.0.1:8000", "http://127.0.0.1:8000"), ("0.0.0.0:8123", "http://127.0.0.1:8123"),
    ("[::]:9000", "http://[::1]:9000"), ("[::1]:9000", "http://[::1]:9000"),
    ("regatta.internal:80", "http://regatta.internal:80"),
])
def test_a_server_bound_anywhere_is_reached_on_its_own_port(bind, url):
    assert reachable_url(bind) == url


def test_it_reads_a_choice_whatever_its_case(monkeypatch):
    monkeypatch.setenv("REGATTA_X", "warning")
    assert env_choice("REGATTA_X", "INFO", choices=("INFO", "WARNING")) == "WARNING"


def _django_check(env_overrides):
    env = {**os.environ, **env_overrides}
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_a_bad_database_url_stops_the_process_at_start_naming_it(tmp_path):
    result = _django_check({"DATABASE_URL": "mysql://x", "REGATTA_STATE_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "DATABASE_URL must start with one of" in result.stderr


@pytest.mark.parametrize(("env", "fragment"), [
    ({"DATABASE_URL": "postgres://regatta:s3cret@db:port/regatta"}, "DATABASE_URL is malformed"),
    ({"DATABASE_URL": "postgres://regatta:s3cret@db:5432/"}, "DATABASE_URL must name a database"),
    ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ({"REGATTA_BIND": "8000"}, "REGATTA_BIND must be host:port"),
    ({"REGATTA_BIND": "127.0.0.1:port"}, "REGATTA_BIND must end in a port"),
])
@pytest.mark.slow
def test_a_malformed_value_stops_the_process_at_start_naming_it(tmp_path, env, fragment):
    result = _django_check({**env, "REGATTA_STATE_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert fragment in result.stderr, result.stderr[-2000:]
    assert "s3cret" not in result.stderr  # a database URL's password stays out of logs


def test_the_run_command_binds_where_regatta_bind_says(settings):
    from controlplane.management.commands.regatta_up import Command

    settings.REGATTA_BIND = "0.0.0.0:8123"
    options = Command().create_parser("manage.py", "regatta_up").parse_args([])
    assert options.bind == "0.0.0.0:8123"


def test_the_run_command_refuses_a_malformed_bind_argument():
    from django.core.management.base import CommandError

    from controlplane.management.commands.regatta_up import Command

    parser = Command().create_parser("manage.py", "regatta_up")
    with pytest.raises(CommandError, match="must end in a port"):
        parser.parse_args(["--bind", "127.0.0.1:http"])


@pytest.mark.slow
def test_a_bad_sweep_interval_stops_the_process_at_start_naming_it(tmp_path):
    result = _django_check(
        {"REGATTA_SWEEP_INTERVAL_S": "soon", "REGATTA_STATE_DIR": str(tmp_path)}
    )
    assert result.returncode != 0
    assert "REGATTA_SWEEP_INTERVAL_S must be a number" in result.stderr


@pytest.mark.slow
def test_with_nothing_set_it_uses_sqlite_in_wal_mode_and_the_embedded_broker(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["REGATTA_STATE_DIR"] = str(tmp_path)
    code = (
        "import django; django.setup();"
        "from django.conf import settings; from django.db import connection;"
        "c = connection.cursor(); c.execute('PRAGMA journal_mode');"
        "print(settings.DATABASES['default']['ENGINE'], c.fetchone()[0],"
        " settings.CELERY_BROKER_URL)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
    )
    assert out.returncode == 0, out.stderr
    engine, journal, broker = out.stdout.split()
    assert engine == "django.db.backends.sqlite3"
    assert journal == "wal"
    assert broker == f"redis+socket://{tmp_path}/redis.sock"


def _secret_key_of(state_dir, **env):
    code = ("import django; django.setup(); from django.conf import settings;"
            " print(settings.SECRET_KEY)")
    base = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**base, **env, "REGATTA_STATE_DIR": str(state_dir),
             "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.slow
def test_with_no_secret_key_each_state_folder_gets_its_own_random_one_kept_private(tmp_path):
    first = _secret_key_of(tmp_path / "a")
    assert first == _secret_key_of(tmp_path / "a")  # web, worker and beat agree
    assert first != _secret_key_of(tmp_path / "b")
    assert len(first) >= 50
    assert (tmp_path / "a" / "secret_key").stat().st_mode & 0o077 == 0
    assert _secret_key_of(tmp_path / "a", SECRET_KEY="from-the-env") == "from-the-env"


def _settings_of(state_dir, names, **env):
    code = ("import django; django.setup(); from django.conf import settings;"
            f" print(*[getattr(settings, n) for n in {names!r}])")
    base = {k: v for k, v in os.environ.items()
            if k not in ("REGATTA_PUBLIC_URL", "REGATTA_SECURE_COOKIES", "REGATTA_BIND")}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**base, **env, "REGATTA_STATE_DIR": str(state_dir),
             "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
    )


@pytest.mark.slow
@pytest.mark.parametrize(("env", "secure"), [
    ({}, "False"),
    ({"REGATTA_PUBLIC_URL": "https://regatta.example.com"}, "True"),
    ({"REGATTA_PUBLIC_URL": "https://regatta.example.com", "REGATTA_SECURE_COOKIES": "no"},
     "False"),
    ({"REGATTA_SECURE_COOKIES": "yes"}, "True"),
])
def test_cookies_are_secure_when_the_web_is_served_over_https(tmp_path, env, secure):
    out = _settings_of(tmp_path, ["SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"], **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [secure, secure]


@pytest.mark.slow
@pytest.mark.parametrize(("env", "url"), [
    ({}, "http://127.0.0.1:8000"),
    ({"REGATTA_BIND": "0.0.0.0:8123"}, "http://127.0.0.1:8123"),
    ({"REGATTA_BIND": "0.0.0.0:8123", "REGATTA_PUBLIC_URL": "https://regatta.example.com"},
     "https://regatta.example.com"),
])
def test_ranks_report_where_the_web_is_bound_unless_a_public_url_is_set(tmp_path, env, url):
    """A web moved to another port takes the ranks' reporting URL with it;
    before, they kept sending to :8000 and the job showed no metrics."""
    out = _settings_of(tmp_path, ["PUBLIC_URL"], **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [url]


@pytest.mark.slow
def test_a_malformed_rate_stops_the_process_at_start_naming_it(tmp_path):
    out = _settings_of(tmp_path, ["SECRET_KEY"], REGATTA_LOGIN_RATE="lots")
    assert out.returncode != 0
    assert "REGATTA_LOGIN_RATE must be a count per second, minute, hour or day" in out.stderr
