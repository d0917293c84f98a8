"""Guessing passwords and minting tokens in bulk are throttled: past the
rate a clear 429 with Retry-After, and nothing checked or written."""

import pytest
from django.conf import settings
from django.test import Client

from accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def allowed(scope: str) -> int:
    """How many the configured rate lets through (REGATTA_LOGIN_RATE, …)."""
    return int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"][scope].split("/")[0])


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_wrong_passwords_past_the_rate_are_a_429_even_with_the_right_one(owner, path):
    client = Client()
    for _ in range(allowed("login")):
        resp = client.post(path, {"username": "olivia", "password": "guess"})
        assert resp.status_code == 200  # the form again, saying the password is wrong
    resp = client.post(path, {"username": "olivia", "password": "pw-olivia"})
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0
    assert b"Too many sign-in attempts" in resp.content
    assert "_auth_user_id" not in client.session  # not signed in


def test_the_count_is_per_user_name_from_any_address(owner, teammate):
    for n in range(allowed("login")):
        Client(REMOTE_ADDR=f"10.0.0.{n}").post("/login/", {"username": "OLIVIA",
                                                           "password": "guess"})
    assert Client(REMOTE_ADDR="10.9.9.9").post(
        "/login/", {"username": "olivia", "password": "pw-olivia"}).status_code == 429
    # Another user signs in as usual.
    resp = Client().post("/login/", {"username": "tom", "password": "pw-tom"})
    assert resp.status_code == 302


def test_token_creation_past_the_rate_is_a_429_and_creates_nothing(api, owner):
    client = api(owner)
    for n in range(allowed("token_create")):
        assert client.post("/api/v1/tokens/", {"name": f"t{n}"}, format="json").status_code \
            == 201
    resp = client.post("/api/v1/tokens/", {"name": "one-too-many"}, format="json")
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0
    assert "throttled" in resp.json()["detail"]
    assert not ApiToken.objects.filter(name="one-too-many").exists()
    assert client.get("/api/v1/tokens/").status_code == 200  # listing is not throttled
