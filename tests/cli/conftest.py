import pytest
from click.testing import CliRunner

from accounts.models import ApiToken
from cli.main import cli


@pytest.fixture
def token():
    def _token(user) -> str:
        return ApiToken.issue(user, "cli-test")[1]
    return _token


@pytest.fixture
def regatta(live_server, tmp_path, monkeypatch):
    """Runs `regatta ARGS` in-process against the live server, with its own
    config file; returns click's Result (exit_code, stdout, stderr)."""
    monkeypatch.delenv("REGATTA_API_URL", raising=False)
    monkeypatch.delenv("REGATTA_API_TOKEN", raising=False)
    config = tmp_path / "regatta.json"

    def _run(*args, env=None):
        runner = CliRunner()
        return runner.invoke(cli, ["--config", str(config), *map(str, args)], env=env,
                             catch_exceptions=False)

    _run.config = config
    _run.url = live_server.url
    return _run


@pytest.fixture
def logged_in(regatta, token):
    def _login(user):
        result = regatta("login", "--url", regatta.url, "--token", token(user))
        assert result.exit_code == 0, result.output
        return regatta
    return _login
