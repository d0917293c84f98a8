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


def full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def spellings(name: str) -> list[str]:
    """Spellings the sign-in form reads as `name` (stripped, then NFKC):
    each signs in as that account with its password."""
    return [f" {name}", f"{name} ", f"\t{name}", f"{name}\n", f"\u3000{name}",
            f"\xa0{name} ", full_width(name), full_width(name[0]) + name[1:],
            f" {full_width(name)}\t"]


SIGN_INS = [("/login/", "olivia", "pw-olivia", "/"),
            ("/admin/login/?next=/admin/", "ada", "pw-ada", "/admin/")]


@pytest.mark.parametrize(("path", "name", "password", "home"), SIGN_INS)
def test_each_spelling_signs_in_as_the_account_it_names(owner, admin_user_, path, name,
                                                        password, home):
    """The premise of the next test: these spellings are the account's name."""
    for spelling in [*spellings(name), "ℴlivia"] if name == "olivia" else spellings(name):
        resp = Client().post(path, {"username": spelling, "password": password})
        assert resp.status_code == 302 and resp["Location"] == home, spelling


@pytest.mark.parametrize(("path", "name", "password", "home"), SIGN_INS)
def test_no_spelling_of_the_name_gets_fresh_tries(owner, admin_user_, path, name, password,
                                                  home):
    for n in range(allowed("login")):
        spelling = [name, f" {name}", f"{full_width(name)}\t"][n % 3]
        assert Client(REMOTE_ADDR=f"10.0.1.{n}").post(
            path, {"username": spelling, "password": "guess"}).status_code == 200
    for spelling in [*spellings(name), name.upper(), name.title()]:
        client = Client(REMOTE_ADDR="10.0.2.1")
        resp = client.post(path, {"username": spelling, "password": password})
        assert resp.status_code == 429, (spelling, resp.status_code)
        assert "_auth_user_id" not in client.session


def test_failures_from_one_address_are_counted_across_names(owner):
    """Guessing many accounts' passwords from one address is slowed too."""
    guesser = Client(REMOTE_ADDR="10.0.3.7")
    for n in range(allowed("login_address")):
        assert guesser.post("/login/", {"username": f"user{n}",
                                        "password": "guess"}).status_code == 200
    resp = guesser.post("/login/", {"username": "olivia", "password": "pw-olivia"})
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0
    assert b"from this address" in resp.content
    # The account itself is not locked: from elsewhere it signs in.
    assert Client(REMOTE_ADDR="10.0.3.8").post(
        "/login/", {"username": "olivia", "password": "pw-olivia"}).status_code == 302


def test_a_forwarded_for_header_does_not_make_a_new_address(owner):
    """With no trusted proxy (REGATTA_TRUSTED_PROXIES=0) the header is the
    caller's own word: it cannot buy fresh tries."""
    for n in range(allowed("login_address")):
        Client(REMOTE_ADDR="10.0.4.1", HTTP_X_FORWARDED_FOR=f"192.0.2.{n}").post(
            "/login/", {"username": f"user{n}", "password": "guess"})
    assert Client(REMOTE_ADDR="10.0.4.1", HTTP_X_FORWARDED_FOR="192.0.2.200").post(
        "/login/", {"username": "olivia", "password": "pw-olivia"}).status_code == 429


def test_behind_a_trusted_proxy_the_address_it_saw_is_counted(owner, settings):
    settings.TRUSTED_PROXIES = 1
    for n in range(allowed("login_address")):
        Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="spoofed, 192.0.2.9").post(
            "/login/", {"username": f"user{n}", "password": "guess"})
    proxy = {"REMOTE_ADDR": "127.0.0.1"}
    assert Client(**proxy, HTTP_X_FORWARDED_FOR="192.0.2.9").post(
        "/login/", {"username": "olivia", "password": "pw-olivia"}).status_code == 429
    # Another caller behind the same proxy is not held up.
    assert Client(**proxy, HTTP_X_FORWARDED_FOR="192.0.2.10").post(
        "/login/", {"username": "olivia", "password": "pw-olivia"}).status_code == 302


def test_successful_sign_ins_are_not_counted(owner):
    for _ in range(allowed("login") + allowed("login_address") + 1):
        client = Client()
        assert client.post("/login/", {"username": "olivia",
                                       "password": "pw-olivia"}).status_code == 302


def test_refused_token_requests_cost_nothing(api, owner):
    """A 400 creates no token, so it does not count: whoever sends bad
    requests is not locked out of making a good one."""
    client = api(owner)
    for _ in range(allowed("token_create") + 5):
        assert client.post("/api/v1/tokens/", {"name": ""}, format="json").status_code == 400
    assert client.post("/api/v1/tokens/", {"name": "good"}, format="json").status_code == 201


@pytest.mark.parametrize("body", [
    {f"f{n}": "x" for n in range(1200)} | {"username": "olivia", "password": "guess"},
    {"username": "olivia", "password": "x" * 1_100_000},
])
def test_an_oversized_sign_in_form_is_refused_with_one_warning(owner, caplog, body):
    caplog.set_level("DEBUG")
    resp = Client().post("/login/", body)
    assert resp.status_code in (400, 413)
    records = [r for r in caplog.records if r.levelno >= 30]
    assert [r.levelname for r in records] == ["WARNING"], [
        (r.name, r.levelname, r.getMessage()) for r in records]
    assert records[0].exc_info is None and "\n" not in records[0].getMessage()
